"""The contract every execution mode implements; the runner owns everything else."""

from __future__ import annotations

import abc
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from contract.paths import DEFAULT_WORK_ROOT
from contract.records import EnvironmentSpec
from workloads.drive import PAYLOAD_PYTHON, payload_argv

# One interpreter for the payload in every mode, so differences come from the mode.
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
        return payload_argv(s.workload, s.seed, s.scale, root, payload or self.payload, self.python)


class Mode(abc.ABC):
    """An execution mode: how the payload is launched, synchronized and checked.

    A mode is one class on this base (as BenchExec's tools are on ``BaseTool2``): it must say
    ``name``, whether it can run here (``preflight``) and what to spawn (``launcher``); every
    other hook has the default documented on it, so a mode overrides only what it needs.
    """

    name: str
    staged: bool = False  # works on a copy; the original workspace must stay intact
    # Whether ``prepare`` may change the workspace (a staged mode's original is then
    # snapshotted after it; else the fixture's own snapshot, kept per fixture, is the original's
    # state before the run: the workspace is a faithful copy of it).
    prepares_workspace: bool = False
    # Bytes the mode's own helpers (a container client, a runtime's monitor) add to the
    # environment's cgroup beside a sandbox whose own limit equals the quota, so that limit is
    # the one that binds.
    cgroup_overhead_bytes: int = 0
    # The least share of the CPU time the payload reports for itself that the environment's
    # cgroup must show (``worker.containment``): one kernel accounts both, so far less means
    # the work ran elsewhere. A guest's clock is its own (a vCPU the host throttles still
    # counts its time), so the VM modes ask less.
    reported_cpu_floor: float = 0.9
    # Further fresh copies of the fixture the mode works with, as paths relative to its
    # ``env_dir`` (staged: its output target); the runner makes them at the same time as the
    # workspace's own copy, each by a process of its own, before ``prepare``.
    fixture_copies: tuple[str, ...] = ()
    # The names of the plan options (a mode table's ``options``) it takes; a plan giving any
    # other is refused (``coordinator.plan.modes``).
    option_names: frozenset[str] = frozenset()

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Self:
        """The mode built from its plan options (default: it takes none)."""
        return cls()

    @abc.abstractmethod
    def preflight(self, host: HostInfo) -> Preflight:
        """Can it run here, and why not."""

    def prepare(self, env: EnvContext) -> None:  # noqa: B027 -- a default: nothing to do
        """Not timed: preparation before the marker (default: nothing beyond the runner's)."""

    @abc.abstractmethod
    def launcher(self, env: EnvContext) -> list[str]:
        """The argv spawned right after the marker."""

    def sync(self, env: EnvContext, round: int) -> None:  # noqa: B027 -- a default: nothing to do
        """The mode's synchronization of round ``round``, inside the round clock (default:
        nothing beyond the payload's own fsyncs)."""

    def result_root(self, env: EnvContext) -> Path:
        """Where the oracle looks after the launcher exited (default: the workspace)."""
        return env.workspace

    def oom_killed(self, env: EnvContext) -> bool:
        """An OOM kill the environment's cgroup cannot show, e.g. in a sandbox's own memory
        cgroup that is gone when it stops; read before cleanup (default: none)."""
        return False

    def failure_context(self, env: EnvContext) -> str:
        """What the mode adds to a failure's detail, e.g. a guest's console (default: nothing).

        The runner calls it only for a failure and never lets it raise.
        """
        return ""

    def cleanup(self, env: EnvContext) -> None:  # noqa: B027 -- a default: nothing to do
        """Not timed: remove whatever prepare and the launcher created; safe to call twice
        (default: nothing, the runner removes the workspace and the cgroup)."""
