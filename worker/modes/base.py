"""The contract every execution mode implements; the runner owns everything else."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tasks.paths import DEFAULT_WORK_ROOT
from tasks.records import EnvironmentSpec

# One interpreter for the payload in every mode, so differences come from the mode.
PAYLOAD_PYTHON = os.environ.get("SANDBENCH_PYTHON", "/usr/bin/python3")
# The launched bootstrap; its body lives beside it, so modes make the whole directory visible.
PAYLOAD_PATH = Path(__file__).resolve().parents[2] / "workloads" / "payload.py"
# The launcher's stderr, in the environment's directory (the runner writes it; a mode may read it).
STDERR_FILE = "launcher.stderr"


@dataclass(frozen=True)
class Preflight:
    """Whether a mode can run on this host, and if not, why (one line)."""

    ok: bool
    reason: str = ""
    facts: dict[str, Any] = field(default_factory=dict)  # tool versions, accelerator, image id


@dataclass
class HostInfo:
    """Facts about this host that preflights need."""

    name: str = "local"
    work_root: Path = DEFAULT_WORK_ROOT


@dataclass
class EnvContext:
    """One environment as the mode sees it; the runner creates and owns it."""

    spec: EnvironmentSpec
    workspace: Path  # fresh copy of the workload's fixture, on the host
    env_dir: Path  # private scratch directory of this environment (stage, images, ...)
    cgroup_path: str  # cgroup of the environment, relative to the hierarchy root ("/sandbench/...")
    payload: Path = PAYLOAD_PATH
    python: str = PAYLOAD_PYTHON
    state: dict[str, Any] = field(default_factory=dict)  # the mode's own bookkeeping
    deadline_ns: int | None = None  # the limit (time.monotonic_ns), set by the runner at the marker

    def remaining_s(self) -> float:
        """Seconds left before the environment's limit (the whole limit before the marker)."""
        if self.deadline_ns is None:
            return self.spec.limit_s
        return max(0.0, (self.deadline_ns - time.monotonic_ns()) / 1e9)

    @property
    def payload_dir(self) -> Path:
        """The directory holding the payload and its body (``workloads/``), bound as a whole."""
        return self.payload.parent

    def payload_argv(self, root: str, payload: str | None = None) -> list[str]:
        """The payload command line, with ``root`` the workspace path as seen inside the mode."""
        s = self.spec
        return [
            self.python, "-I", "-S", payload or str(self.payload),
            "--workload", s.workload, "--seed", str(s.seed), "--scale", repr(s.scale),
            "--root", root,
        ]  # fmt: skip


def cgroup_overhead(mode: object) -> int:
    """Bytes a mode's own helpers (e.g. the docker client) add to the environment's cgroup.

    A mode whose launcher is a client of a sandbox with its own memory limit (docker) sets
    ``cgroup_overhead_bytes`` so the environment's cgroup leaves room for the client and the
    sandbox's limit, which equals the quota, is the one that binds.
    """
    return int(getattr(mode, "cgroup_overhead_bytes", 0))


def mode_oom_killed(mode: object, env: EnvContext) -> bool:
    """Whether the mode saw an OOM kill the environment's cgroup cannot show (optional hook)."""
    hook = getattr(mode, "oom_killed", None)
    return bool(hook(env)) if hook is not None else False


def mode_failure_context(mode: object, env: EnvContext) -> str:
    """What the mode can add to a failure's detail (optional hook): e.g. a guest's console.

    A guest that hangs before Ready says nothing on the channel; its console shows where it
    stopped. Never raises: a failure's detail must not hide the failure.
    """
    hook = getattr(mode, "failure_context", None)
    if hook is None:
        return ""
    try:
        return str(hook(env) or "")
    except Exception as exc:  # noqa: BLE001 -- a diagnostic must never replace the failure
        return f"(no {mode.__class__.__name__} context: {exc})"


@runtime_checkable
class Mode(Protocol):
    """An execution mode: how the payload is launched, synchronized and checked.

    Optional: ``cgroup_overhead_bytes``, ``oom_killed(env)`` (see ``cgroup_overhead``) and
    ``failure_context(env)`` (see ``mode_failure_context``).
    """

    name: str
    staged: bool  # works on a copy; the original workspace must stay intact

    def preflight(self, host: HostInfo) -> Preflight:
        """Can it run here, and why not."""
        ...

    def prepare(self, env: EnvContext) -> None:
        """Not timed: cgroup-independent preparation (overlay dirs, images, containers)."""
        ...

    def launcher(self, env: EnvContext) -> list[str]:
        """The argv spawned right after the marker."""
        ...

    def sync(self, env: EnvContext, round: int) -> None:
        """The mode's synchronization of round ``round``, inside the round clock."""
        ...

    def result_root(self, env: EnvContext) -> Path:
        """Where the oracle looks after the launcher exited."""
        ...

    def cleanup(self, env: EnvContext) -> None:
        """Not timed: remove whatever prepare created; must be safe to call twice."""
        ...
