"""``command``: a mode defined by a command template, for runtimes sandbench does not ship.

Options (from the plan's mode table or ``--template``):

* ``template``: list of argv elements, or one shell string (run with ``/bin/sh -c``).
  Placeholders: ``{workspace} {payload} {payload_dir} {python} {payload_argv} {cpus}
  {cpu_quota} {memory_bytes} {env_dir}``. In a list, an element that is exactly
  ``{payload_argv}`` expands into the payload's argv; elsewhere it is substituted as one
  shell-quoted string. ``{payload}`` is a small bootstrap that loads its body from beside it:
  a runtime that sees only what it is given must get all of ``{payload_dir}`` (a directory
  named ``workloads``), read-only, and run the ``payload.py`` in it.
* ``root``: the workspace path as the payload sees it (default ``{workspace}``).
* ``result_root``: where the oracle looks (default: ``root``).
* ``staged``: true if the runtime works on a copy (the original workspace must stay intact).
* ``prepare``, ``sync``, ``cleanup``: optional helper templates (``sync`` runs inside each
  round's clock); each must exit 0.
* ``collect``: optional helper run once after the launcher exited, before the oracle looks at
  ``result_root`` (not timed): a runtime that works on a disk image copies its result out here.

A command mode runs whatever its template says as the worker's user (root on a lab host), so a
fleet worker runs one only if its own configuration allows the mode's name
(``worker.config``); ``is_command_mode`` is the one test of what counts as one.

``template_problem`` says what is wrong with a template (empty, unbalanced braces, a
placeholder that does not exist); the plan's validation and ``CommandMode`` both use it. A bare
``{name}`` always reads as a placeholder (``${name}`` is the shell's): write awk's ``{print}``
as ``{ print }``.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

from contract.errors import ModeUnavailable
from worker.modes.base import PAYLOAD_PATH, EnvContext, HostInfo, Mode, Preflight
from worker.procs import run_owned
from workloads.drive import PAYLOAD_PYTHON

PLACEHOLDERS = (
    "workspace", "payload", "payload_dir", "python", "payload_argv", "cpus", "cpu_quota",
    "memory_bytes", "env_dir",
)  # fmt: skip
PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
# Anything that reads as a placeholder: {name}, but not a shell parameter expansion ${name}.
CANDIDATE = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")
HELPERS = ("prepare", "sync", "collect", "cleanup")
PATHS = ("root", "result_root")  # templates of one path: the payload's argv makes no sense there
SHELL = "/bin/sh"
HELPER_TIMEOUT_S = 600.0
SHELL_BUILTINS = ("cd", "set", "export", "ulimit", "umask", ".", "trap", "{", "(")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
Template = list[str] | str


def is_command_mode(name: str, options: dict[str, Any]) -> bool:
    """Whether mode ``name`` with ``options`` is a command mode (a template, or named so)."""
    return options.get("template") is not None or name == "command"


class CommandMode(Mode):
    """A mode whose launcher is a command template from the plan."""

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        template = options.get("template")
        if not template or not isinstance(template, str | list):
            raise ModeUnavailable(
                f"command mode '{name}' needs a 'template' (a list of argv elements or a shell "
                "string with placeholders such as {payload_argv})"
            )
        problems = options_problems(options)
        if problems:
            raise ModeUnavailable(f"command mode '{name}': {' '.join(problems[0])}")
        self.name = name
        self.options = options
        self.template: Template = template
        self.staged = bool(options.get("staged", False))
        self.prepares_workspace = bool(options.get("prepare"))  # its helper may touch it

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
        """Run the ``sync`` helper, if any (inside the round clock, bounded by the limit)."""
        self._helper(env, "sync", env.remaining_s())

    def result_root(self, env: EnvContext) -> Path:
        """``result_root`` (default: the payload's root), after the ``collect`` helper, if any."""
        if not env.state.get("collected"):
            env.state["collected"] = True
            self._helper(env, "collect")
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
            "workspace": str(env.workspace), "payload": str(env.payload),
            "payload_dir": str(env.payload_dir), "python": env.python,
            "cpus": quota.cpus, "cpu_quota": repr(quota.cpu_quota),
            "memory_bytes": str(quota.memory_bytes), "env_dir": str(env.env_dir),
        }  # fmt: skip
        root = _fill(self._root_template(), values, shell=False)
        values["payload_argv"] = env.payload_argv(root)
        return values

    def _helper(self, env: EnvContext, which: str, timeout_s: float = HELPER_TIMEOUT_S) -> None:
        """Run helper template ``which``; OSError (with its stderr) unless it exits 0."""
        template = self.options.get(which)
        if not template:
            return
        argv = expand(template, self._values(env))
        done = run_owned(argv, timeout_s)
        if done.returncode != 0:
            raise OSError(f"{which} helper exited {done.returncode}: {done.stderr.strip()[-500:]}")


def template_problem(template: object, allowed: tuple[str, ...] = PLACEHOLDERS) -> str | None:
    """What is wrong with a command template, in one line; None if nothing."""
    if isinstance(template, str):
        texts = [template]
    elif isinstance(template, list) and all(isinstance(e, str) for e in template):
        texts = template
    else:
        return "must be a shell string or a list of strings"
    if not texts or any(not text.strip() for text in texts):
        return "is empty" if len(texts) < 2 else "has an empty element"
    for text in texts:
        problem = _brace_problem(text) or _placeholder_problem(text, allowed)
        if problem:
            return problem
    return None


def options_problems(options: dict[str, Any]) -> list[tuple[str, str]]:
    """(option, problem) for every template option of a command mode that is wrong."""
    found = []
    fields: list[tuple[str, tuple[str, ...]]] = [("template", PLACEHOLDERS)]
    fields += [(name, PLACEHOLDERS) for name in HELPERS]
    fields += [(name, tuple(p for p in PLACEHOLDERS if p != "payload_argv")) for name in PATHS]
    for name, allowed in fields:
        if options.get(name) is not None:
            problem = template_problem(options[name], allowed)
            if problem:
                found.append((name, problem))
    return found


def _brace_problem(text: str) -> str | None:
    """Unbalanced braces in ``text``, named by column; None if they balance."""
    opened: list[int] = []
    for column, char in enumerate(text, start=1):
        if char == "{":
            opened.append(column)
        elif char == "}" and not opened:
            return f"has unbalanced braces: '}}' at column {column} of {text!r} closes nothing"
        elif char == "}":
            opened.pop()
    if opened:
        return f"has unbalanced braces: '{{' at column {opened[-1]} of {text!r} is never closed"
    return None


def _placeholder_problem(text: str, allowed: tuple[str, ...]) -> str | None:
    """The first ``{name}`` in ``text`` that is not an allowed placeholder, with the fix."""
    for match in CANDIDATE.finditer(text):
        name = match.group(1)
        if name not in allowed:
            near = difflib.get_close_matches(name, allowed, n=1)
            hint = f"did you mean {{{near[0]}}}? " if near else ""
            known = " ".join(f"{{{p}}}" for p in allowed)
            return f"has an unknown placeholder {{{name}}} ({hint}placeholders: {known})"
    return None


def expand(template: Template, values: dict[str, Any]) -> list[str]:
    """The argv of ``template`` with ``values`` substituted (a string runs under /bin/sh -c)."""
    if isinstance(template, str):
        return [SHELL, "-c", _fill(template, values, shell=True)]  # noqa: S604 -- quoted for sh
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
