"""cgroup v2: one unified hierarchy (cpu.max, cpuset.cpus, memory.max, swap, cgroup.kill)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from tasks.records import Quota
from worker.quota import (
    CFS_PERIOD_US,
    KILL_WAIT_S,
    POLL_S,
    Cgroup,
    QuotaError,
    cgroup_mounts,
    remove_dir,
    write_file,
)

NEEDED_CONTROLLERS = ("cpu", "cpuset", "memory")
OPTIONAL_CONTROLLERS = ("pids",)


class CgroupV2(Cgroup):
    """A cgroup of the unified hierarchy, ``<root>/sandbench/<name>``."""

    version = 2

    def __init__(self, path: str, root: Path | None = None) -> None:
        super().__init__(path)
        if root is None:
            mounts = cgroup_mounts()
            if "cgroup2" not in mounts:
                raise QuotaError("no cgroup2 hierarchy is mounted (mount -t cgroup2 none DIR)")
            root = mounts["cgroup2"]
        self.root = root
        self.dir = root / path.strip("/")

    def create(self, quota: Quota | None) -> None:
        """Create the cgroup; with a quota, enable the controllers on the way and set limits."""
        if quota is not None:
            self._enable_controllers(self.root)
        try:
            self.dir.parent.mkdir(exist_ok=True)
            if quota is not None:
                self._enable_controllers(self.dir.parent)
            self.dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise QuotaError(f"cannot create cgroup {self.dir}: {exc.strerror}") from exc
        if quota is not None:
            self._apply(quota)

    def _enable_controllers(self, directory: Path) -> None:
        """Delegate cpu, cpuset, memory (and pids) to the children of ``directory``."""
        available = (directory / "cgroup.controllers").read_text().split()
        missing = [name for name in NEEDED_CONTROLLERS if name not in available]
        if missing:
            raise QuotaError(
                f"cgroup v2 at {directory} lacks the {', '.join(missing)} controller(s); "
                "free them from cgroup v1 or boot with systemd.unified_cgroup_hierarchy=1"
            )
        wanted = NEEDED_CONTROLLERS + tuple(c for c in OPTIONAL_CONTROLLERS if c in available)
        enabled = (directory / "cgroup.subtree_control").read_text().split()
        todo = " ".join(f"+{name}" for name in wanted if name not in enabled)
        if todo:
            write_file(directory / "cgroup.subtree_control", todo)

    def _apply(self, quota: Quota) -> None:
        """Write cpu.max, cpuset.cpus, memory.max, memory.swap.max and group OOM kill."""
        quota_us = max(1000, int(quota.cpu_quota * CFS_PERIOD_US))
        write_file(self.dir / "cpu.max", f"{quota_us} {CFS_PERIOD_US}")
        write_file(self.dir / "cpuset.cpus", quota.cpus)
        write_file(self.dir / "memory.max", str(quota.memory_bytes))
        if (self.dir / "memory.swap.max").exists():
            write_file(self.dir / "memory.swap.max", str(quota.swap_bytes))
        elif quota.swap_bytes == 0:
            write_file(self.dir / "memory.swappiness", "0")
        if (self.dir / "memory.oom.group").exists():
            write_file(self.dir / "memory.oom.group", "1")  # an OOM kills the whole environment

    def join_fds(self) -> list[int]:
        """The cgroup's ``cgroup.procs``."""
        return [os.open(self.dir / "cgroup.procs", os.O_WRONLY)]

    def pids(self) -> list[int]:
        """Processes in the cgroup."""
        try:
            return [int(line) for line in (self.dir / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def kill(self) -> None:
        """``cgroup.kill`` (kernel >= 5.14), else SIGKILL in a loop; wait until empty."""
        deadline = time.monotonic() + KILL_WAIT_S
        while self.pids():
            if (self.dir / "cgroup.kill").exists():
                write_file(self.dir / "cgroup.kill", "1")
            else:
                for pid in self.pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise QuotaError(f"processes survive SIGKILL in cgroup {self.dir}: {self.pids()}")
            time.sleep(POLL_S)

    def _keyed(self, name: str) -> dict[str, int]:
        """A flat-keyed cgroup file (``cpu.stat``, ``memory.events``) as a dict."""
        path = self.dir / name
        if not path.exists():
            return {}
        pairs = (line.split() for line in path.read_text().splitlines() if line.strip())
        return {key: int(value) for key, value in pairs}

    def cpu_seconds(self) -> float:
        """``usage_usec`` of ``cpu.stat`` in seconds."""
        return self._keyed("cpu.stat").get("usage_usec", 0) / 1e6

    def peak_memory(self) -> int | None:
        """``memory.peak`` (kernel >= 5.19), else None."""
        path = self.dir / "memory.peak"
        return int(path.read_text()) if path.exists() else None

    def oom_killed(self) -> bool:
        """``oom_kill`` of ``memory.events``."""
        return self._keyed("memory.events").get("oom_kill", 0) > 0

    def remove(self) -> None:
        """Kill leftovers and remove the directory."""
        if not self.dir.exists():
            return
        self.kill()
        remove_dir(self.dir)
