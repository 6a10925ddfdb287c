"""``command``: a mode defined by a command template, for runtimes sandbench does not ship.

Options (from the plan's mode table or ``--template``):

* ``template``: list of argv elements, or one shell string (run with ``/bin/sh -c``).
  Placeholders: ``{workspace} {payload} {python} {payload_argv} {cpus} {cpu_quota}
  {memory_bytes} {env_dir}``. In a list, an element that is exactly ``{payload_argv}``
  expands into the payload's argv; elsewhere it is substituted as one shell-quoted string.
* ``root``: the workspace path as the payload sees it (default ``{workspace}``).
* ``result_root``: where the oracle looks (default: ``root``).
* ``staged``: true if the runtime works on a copy (the original workspace must stay intact).
* ``prepare``, ``sync``, ``cleanup``: optional helper templates (``sync`` runs inside each
  round's clock); each must exit 0.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

from tasks.errors import ModeUnavailable
from worker.modes.base import PAYLOAD_PATH, PAYLOAD_PYTHON, EnvContext, HostInfo, Preflight
from worker.procs import run_owned

PLACEHOLDERS = (
    "workspace", "payload", "python", "payload_argv", "cpus", "cpu_quota", "memory_bytes", "env_dir"
)  # fmt: skip
PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
SHELL = "/bin/sh"
HELPER_TIMEOUT_S = 600.0
SHELL_BUILTINS = ("cd", "set", "export", "ulimit", "umask", ".", "trap", "{", "(")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
Template = list[str] | str


class CommandMode:
    """A mode whose launcher is a command template from the plan."""

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        template = options.get("template")
        if not template or not isinstance(template, str | list):
            raise ModeUnavailable(
                f"command mode '{name}' needs a 'template' (a list of argv elements or a shell "
                "string with placeholders such as {payload_argv})"
            )
        self.name = name
        self.options = options
        self.template: Template = template
        self.staged = bool(options.get("staged", False))

    def preflight(self, host: HostInfo) -> Preflight:
        """The template's binary exists and is executable."""
        binary = _binary(self.template)
        found = binary if "/" in binary else shutil.which(binary)
        if found is None or not os.access(found, os.X_OK):
            return Preflight(False, f"command mode '{self.name}': '{binary}' is not an executable "
                                    "on this host (install it or fix the template)")  # fmt: skip
        return Preflight(True, facts={"binary": found, "template": self.template})

    def prepare(self, env: EnvContext) -> None:
        """Run the ``prepare`` helper, if any."""
        self._helper(env, "prepare")

    def launcher(self, env: EnvContext) -> list[str]:
        """The template with every placeholder filled in."""
        return expand(self.template, self._values(env))

    def sync(self, env: EnvContext, round: int) -> None:
        """Run the ``sync`` helper, if any (inside the round clock)."""
        self._helper(env, "sync")

    def result_root(self, env: EnvContext) -> Path:
        """``result_root`` (default: the payload's root)."""
        template = str(self.options.get("result_root") or self._root_template())
        return Path(_fill(template, self._values(env), shell=False))

    def cleanup(self, env: EnvContext) -> None:
        """Run the ``cleanup`` helper, if any."""
        self._helper(env, "cleanup")

    def _root_template(self) -> str:
        """The payload's root as a template."""
        return str(self.options.get("root") or "{workspace}")

    def _values(self, env: EnvContext) -> dict[str, Any]:
        """Placeholder values for ``env``."""
        quota = env.spec.quota
        values: dict[str, Any] = {
            "workspace": str(env.workspace), "payload": str(env.payload), "python": env.python,
            "cpus": quota.cpus, "cpu_quota": repr(quota.cpu_quota),
            "memory_bytes": str(quota.memory_bytes), "env_dir": str(env.env_dir),
        }  # fmt: skip
        root = _fill(self._root_template(), values, shell=False)
        values["payload_argv"] = env.payload_argv(root)
        return values

    def _helper(self, env: EnvContext, which: str) -> None:
        """Run helper template ``which``; OSError (with its stderr) unless it exits 0."""
        template = self.options.get(which)
        if not template:
            return
        argv = expand(template, self._values(env))
        done = run_owned(argv, HELPER_TIMEOUT_S)
        if done.returncode != 0:
            raise OSError(f"{which} helper exited {done.returncode}: {done.stderr.strip()[-500:]}")


def expand(template: Template, values: dict[str, Any]) -> list[str]:
    """The argv of ``template`` with ``values`` substituted (a string runs under /bin/sh -c)."""
    if isinstance(template, str):
        return [SHELL, "-c", _fill(template, values, shell=True)]
    argv: list[str] = []
    for element in template:
        if element == "{payload_argv}":
            argv.extend(values["payload_argv"])
        else:
            argv.append(_fill(element, values, shell=False))
    return argv


def _fill(text: str, values: dict[str, Any], shell: bool) -> str:
    """Substitute the known placeholders in ``text`` (shell-quoted when ``shell``)."""

    def one(match: re.Match[str]) -> str:
        value = values.get(match.group(1), match.group(0))
        if isinstance(value, list):
            return shlex.join(value)
        return shlex.quote(str(value)) if shell else str(value)

    return PLACEHOLDER.sub(one, text)


def _binary(template: Template) -> str:
    """The program a template runs (its first word, with {python} resolved; the shell for
    a shell string that starts with a builtin such as ``cd``)."""
    if isinstance(template, str):
        words = [w for w in shlex.split(template) if w != "exec" and not ASSIGNMENT.match(w)]
        first = words[0] if words and words[0] not in SHELL_BUILTINS else SHELL
    else:
        first = template[0]
    return _fill(first, {"python": PAYLOAD_PYTHON, "payload": str(PAYLOAD_PATH)}, shell=False)
