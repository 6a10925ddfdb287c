"""``native``: the payload runs directly in the workspace, under the environment's cgroup."""

from __future__ import annotations

import subprocess

from worker.modes.base import EnvContext, HostInfo, Mode, Preflight
from workloads.drive import PAYLOAD_PYTHON

VERSION_TIMEOUT_S = 10.0


def python_version(python: str = PAYLOAD_PYTHON) -> str | None:
    """``python --version`` of the payload interpreter, or None if it cannot run."""
    try:
        done = subprocess.run(
            [python, "-I", "-S", "--version"], capture_output=True, text=True,
            timeout=VERSION_TIMEOUT_S, check=False,
        )  # fmt: skip
    except OSError:
        return None
    return (done.stdout or done.stderr).strip() or None


class NativeMode(Mode):
    """The reference mode: no isolation beyond the cgroup quota."""

    name = "native"

    def preflight(self, host: HostInfo) -> Preflight:
        """Runs wherever the payload interpreter runs."""
        version = python_version()
        if version is None:
            return Preflight(False, f"payload interpreter {PAYLOAD_PYTHON} does not run")
        return Preflight(True, facts={"python": version})

    def launcher(self, env: EnvContext) -> list[str]:
        """The payload itself, rooted at the workspace."""
        return env.payload_argv(str(env.workspace))
