"""cgroup v1: one directory per controller hierarchy (cpu, cpuacct, cpuset, memory, pids, ...)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from contract.errors import QuotaError
from contract.records import Quota
from worker.cgroups.base import (
    CFS_PERIOD_US,
    KILL_WAIT_S,
    POLL_S,
    Cgroup,
    cgroup_mounts,
    poll_waits,
    remove_dir,
    write_file,
)

CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids", "freezer")
REQUIRED = ("cpu", "cpuacct", "cpuset", "memory", "pids")
FREEZE_WAIT_S = 2.0
# Limit files read back for the record: (controller, file).
LIMIT_FILES = (
    ("cpu", "cpu.cfs_quota_us"), ("cpu", "cpu.cfs_period_us"), ("cpuset", "cpuset.cpus"),
    ("memory", "memory.limit_in_bytes"), ("memory", "memory.memsw.limit_in_bytes"),
)  # fmt: skip


class CgroupV1(Cgroup):
    """A cgroup present in every v1 hierarchy under the same relative path."""

    version = 1

    def __init__(self, path: str, mounts: dict[str, Path] | None = None) -> None:
        super().__init__(path)
        mounts = mounts if mounts is not None else cgroup_mounts()
        missing = [name for name in REQUIRED if name not in mounts]
        if missing:
            raise QuotaError(f"cgroup v1 controllers not mounted: {', '.join(missing)}")
        rel = path.strip("/")
        self.dirs = {name: mounts[name] / rel for name in CONTROLLERS if name in mounts}

    def placement_of(self, proc_cgroup: str) -> list[str]:
        """The paths of the ``REQUIRED`` controllers' lines (``4:cpu,cpuacct:/path``)."""
        paths = []
        for line in proc_cgroup.splitlines():
            _, controllers, path = line.split(":", 2)
            if set(controllers.split(",")) & set(REQUIRED):
                paths.append(path)
        return paths

    def _unique_dirs(self) -> list[Path]:
        """The cgroup's directories, once each (co-mounted controllers share one)."""
        return list(dict.fromkeys(self.dirs.values()))

    def create(self, quota: Quota | None) -> None:
        """Create the directories in every hierarchy and apply ``quota``."""
        for directory in self._unique_dirs():
            for level in (directory.parent, directory):
                if not level.exists():
                    try:
                        level.mkdir(exist_ok=True)
                    except OSError as exc:
                        raise QuotaError(f"cannot create cgroup {level}: {exc.strerror}") from exc
        self._init_cpuset(self.dirs["cpuset"].parent)
        self._init_cpuset(self.dirs["cpuset"], quota.cpus if quota else None)
        if quota is not None:
            self._apply(quota)

    def _init_cpuset(self, directory: Path, cpus: str | None = None) -> None:
        """A v1 cpuset accepts tasks only once cpus and mems are set: inherit what is unset."""
        parent = directory.parent
        for name, value in (("cpuset.cpus", cpus), ("cpuset.mems", None)):
            current = (directory / name).read_text().strip()
            wanted = value or current or (parent / name).read_text().strip()
            if wanted != current:
                write_file(directory / name, wanted)

    def _apply(self, quota: Quota) -> None:
        """Write the CPU and memory limits (swap: memsw = memory + swap)."""
        cpu = self.dirs["cpu"]
        write_file(cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US))
        write_file(cpu / "cpu.cfs_quota_us", str(max(1000, int(quota.cpu_quota * CFS_PERIOD_US))))
        memory = self.dirs["memory"]
        write_file(memory / "memory.limit_in_bytes", str(quota.memory_bytes))
        memsw = memory / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            write_file(memsw, str(quota.memory_bytes + quota.swap_bytes))
        elif quota.swap_bytes == 0:
            write_file(memory / "memory.swappiness", "0")

    def join_paths(self) -> list[Path]:
        """One ``tasks`` file per hierarchy: "0" written there moves the writing thread alone.

        The writers are single-threaded (the launcher's shim, a child between fork and exec),
        so the thread is the whole process; a thread moving itself needs no threadgroup held
        still, and the kernel (6.18 here) skips the global threadgroup lock, whose write side
        waits for an RCU grace period: a ``cgroup.procs`` write of "0" takes it. Measured here
        (``benchmarks/cgroup_join.py``): 2.2 ms against 12.9 ms before every marker.
        """
        return [d / "tasks" for d in self._unique_dirs()]

    def pids(self) -> list[int]:
        """Processes in the pids hierarchy's cgroup."""
        try:
            text = (self.dirs["pids"] / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return [int(line) for line in text.split()]

    def kill(self) -> None:
        """Freeze (so nothing forks away), SIGKILL every process, thaw, wait until empty."""
        deadline, waits = time.monotonic() + KILL_WAIT_S, poll_waits()
        while self.pids():
            frozen = self._freeze("FROZEN")
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if frozen:
                self._freeze("THAWED")
            if time.monotonic() > deadline:
                raise QuotaError(f"processes survive SIGKILL in cgroup {self.path}: {self.pids()}")
            time.sleep(next(waits))

    def _freeze(self, state: str) -> bool:
        """Set the freezer state; True once reached (False without a freezer hierarchy)."""
        freezer = self.dirs.get("freezer")
        if freezer is None or not freezer.exists():
            return False
        write_file(freezer / "freezer.state", state)
        deadline = time.monotonic() + FREEZE_WAIT_S
        while (freezer / "freezer.state").read_text().strip() != state:
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S / 10)
        return True

    def cpu_seconds(self) -> float:
        """``cpuacct.usage`` (ns) in seconds."""
        return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text()) / 1e9

    def peak_memory(self) -> int | None:
        """``memory.max_usage_in_bytes``: the high-water mark of memory charged to the cgroup."""
        return int((self.dirs["memory"] / "memory.max_usage_in_bytes").read_text())

    def oom_killed(self) -> bool:
        """``oom_kill`` of ``memory.oom_control`` (``under_oom`` on kernels without it)."""
        fields = dict(
            line.split()
            for line in (self.dirs["memory"] / "memory.oom_control").read_text().splitlines()
            if line.strip()
        )
        if "oom_kill" in fields:
            return int(fields["oom_kill"]) > 0
        return int(fields.get("under_oom", "0")) > 0

    def limits(self) -> dict[str, str]:
        """The limits as the kernel reports them, read back from each hierarchy's files."""
        found = {}
        for controller, name in LIMIT_FILES:
            path = self.dirs[controller] / name
            if path.exists():
                found[name] = path.read_text().strip()
        return found

    def remove(self) -> None:
        """Kill leftovers, reclaim the memory charged to the cgroup, remove the directory from
        every hierarchy."""
        if not any(d.exists() for d in self._unique_dirs()):
            return
        self.kill()
        self.reclaim()
        for directory in self._unique_dirs():
            remove_dir(directory)

    def reclaim(self) -> None:
        """``memory.force_empty``: free (or move to the parent) every page still charged here.

        Without it a removed memory cgroup lingers as a dying one for as long as any page
        charged to it stays cached (on ext4: the metadata pages an environment brought in), one
        per environment. The runner writes the deletions back first (a dirty page cannot be
        freed here). This is hygiene: it did not remove the metadata drift (README).
        """
        force = self.dirs["memory"] / "memory.force_empty"
        if force.exists():
            with contextlib.suppress(QuotaError):  # best effort: an rmdir follows in any case
                write_file(force, "0")
