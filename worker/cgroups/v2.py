"""cgroup v2: one unified hierarchy (cpu.max, cpuset.cpus, memory.max, swap, cgroup.kill).

Layout. The v2 "no internal processes" rule forbids a cgroup that both holds processes and
gives controllers to its children, so an environment is a small subtree::

    <parent>/<name>            the quota (cpu.max, cpuset, memory.max, swap), accounting, kill
    <parent>/<name>/launcher   the launcher's process tree (a leaf)
    <parent>/<name>/<other>    leaves a mode's runtime adds (docker: the container's cgroup)

Limits bind the whole subtree, and ``cpu.stat``, ``memory.peak``, ``memory.events`` and
``cgroup.kill`` of ``<name>`` cover it too. Where ``<parent>`` is depends on where this process
runs (``placement``): in the root cgroup (a root shell outside any service) it is ``/sandbench``;
under a delegated service (systemd's ``Delegate=yes``) the service's own processes move into a
leaf ``supervisor`` and ``<parent>`` is ``<service>/envs``, so nothing is written outside the
subtree the service was given.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from contract.environ import setting
from contract.errors import QuotaError
from contract.records import Quota
from worker.cgroups.base import (
    CFS_PERIOD_US,
    KILL_WAIT_S,
    PARENT_NAME,
    Cgroup,
    cgroup_mounts,
    poll_waits,
    remove_dir,
    write_file,
)

NEEDED_CONTROLLERS = ("cpu", "cpuset", "memory")
OPTIONAL_CONTROLLERS = ("pids",)
LAUNCHER_LEAF = "launcher"
SUPERVISOR_LEAF = "supervisor"
ENVS_DIR = "envs"
DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")  # set by systemd >= 251 on Delegate=yes
DELEGATED_ENV = "SANDBENCH_CGROUP_DELEGATED"  # "1": systemd < 251 (a drop-in of the unit sets it)
MOVE_ROUNDS = 50  # a service forking while we move it: retry this often
LIMIT_FILES = ("cpu.max", "cpuset.cpus", "cpuset.cpus.effective", "memory.max", "memory.swap.max")


@dataclass(frozen=True)
class Placement:
    """Where this process's environment cgroups go."""

    kind: str  # "root" (root cgroup or not delegated) or "delegated"
    own: str  # this process's cgroup (from /proc/self/cgroup)
    anchor: str  # the cgroup sandbench may configure below: "/" or the delegated service
    parent: str  # environment cgroups are <parent>/<name>


def unified_root() -> Path:
    """The mount point of the unified hierarchy (QuotaError if none is mounted)."""
    mounts = cgroup_mounts()
    if "cgroup2" not in mounts:
        raise QuotaError("no cgroup2 hierarchy is mounted (mount -t cgroup2 none /sys/fs/cgroup)")
    return mounts["cgroup2"]


def own_cgroup(pid: int | str = "self") -> str:
    """The v2 cgroup of process ``pid`` (the ``0::`` line of its ``/proc/PID/cgroup``)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:].split(" ")[0] or "/"
    return "/"


def is_delegated(directory: Path) -> bool:
    """Whether the cgroup ``directory`` was delegated to its processes (systemd's xattr)."""
    for name in DELEGATE_XATTRS:
        with contextlib.suppress(OSError):
            if os.getxattr(directory, name) == b"1":
                return True
    return False


def placement(root: Path | None = None) -> Placement:
    """Where environment cgroups go for this process: delegated subtree, else ``/sandbench``."""
    root = root or unified_root()
    own = own_cgroup()
    service = own
    if PurePosixPath(own).name == SUPERVISOR_LEAF:  # moved there by an earlier environment
        service = str(PurePosixPath(own).parent)
    delegated = setting(DELEGATED_ENV) == "1" or is_delegated(_dir(root, service))
    if own != "/" and delegated:
        return Placement("delegated", own, service, f"{service.rstrip('/')}/{ENVS_DIR}")
    return Placement("root", own, "/", f"/{PARENT_NAME}")


def _dir(root: Path, path: str) -> Path:
    """The directory of cgroup ``path`` under the mount ``root``."""
    return root / path.strip("/")


class CgroupV2(Cgroup):
    """An environment's subtree ``<parent>/<name>`` of the unified hierarchy."""

    version = 2

    def __init__(self, path: str, root: Path | None = None, anchor: str = "/") -> None:
        super().__init__(path)
        self.root = root or unified_root()
        self.dir = _dir(self.root, path)
        self.launcher_dir = self.dir / LAUNCHER_LEAF
        self.anchor = anchor  # controllers are enabled from here down to the environment
        self.placement = "root" if anchor == "/" else "delegated"

    def placement_of(self, proc_cgroup: str) -> list[str]:
        """The unified hierarchy's line (``0::/path``)."""
        return [line[3:] for line in proc_cgroup.splitlines() if line.startswith("0::")]

    @classmethod
    def for_environment(cls, name: str) -> CgroupV2:
        """The (not yet created) cgroup of environment ``name``, placed for this process."""
        root = unified_root()
        where = placement(root)
        return cls(f"{where.parent}/{name}", root, anchor=where.anchor)

    def create(self, quota: Quota | None) -> None:
        """Create the subtree; with a quota, enable the controllers on the way and set limits."""
        if quota is not None and self.anchor != "/":
            move_processes(_dir(self.root, self.anchor), SUPERVISOR_LEAF)
        try:
            for level in self._levels():
                level.mkdir(exist_ok=True)
                if quota is not None:
                    self._enable_controllers(level)
            self.dir.mkdir(exist_ok=True)
            if quota is not None:
                self._apply(quota)
                self._enable_controllers(self.dir)
            self.launcher_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise QuotaError(f"cannot create cgroup {self.dir}: {exc.strerror}") from exc

    def _levels(self) -> list[Path]:
        """The anchor and every directory between it and the environment's cgroup."""
        anchor = _dir(self.root, self.anchor)
        levels = [anchor]
        for part in self.dir.parent.relative_to(anchor).parts:
            levels.append(levels[-1] / part)
        return levels

    def _enable_controllers(self, directory: Path) -> None:
        """Give cpu, cpuset, memory (and pids) to the children of ``directory``."""
        available = (directory / "cgroup.controllers").read_text().split()
        missing = [name for name in NEEDED_CONTROLLERS if name not in available]
        if missing:
            raise QuotaError(
                f"cgroup v2 at {directory} lacks the {', '.join(missing)} controller(s); "
                f"enable them in its parent's cgroup.subtree_control (a systemd unit: "
                f"Delegate=yes), or free them from cgroup v1 (boot with cgroup_no_v1=all)"
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

    def join_paths(self) -> list[Path]:
        """The launcher leaf's ``cgroup.procs``."""
        return [self.launcher_dir / "cgroup.procs"]

    def _subtree(self) -> list[Path]:
        """The environment's cgroup and every cgroup below it, deepest first."""
        if not self.dir.exists():
            return []
        found = [Path(d) for d, _subdirs, _files in os.walk(self.dir)]
        return sorted(found, key=lambda p: len(p.parts), reverse=True)

    def pids(self) -> list[int]:
        """Processes anywhere in the environment's subtree."""
        pids: list[int] = []
        for directory in self._subtree():
            with contextlib.suppress(FileNotFoundError):
                pids += [int(line) for line in (directory / "cgroup.procs").read_text().split()]
        return pids

    def kill(self) -> None:
        """``cgroup.kill`` of the subtree (kernel >= 5.14), else SIGKILL; wait until empty."""
        deadline, waits = time.monotonic() + KILL_WAIT_S, poll_waits()
        while self.pids():
            if (self.dir / "cgroup.kill").exists():
                write_file(self.dir / "cgroup.kill", "1")
            else:
                for pid in self.pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise QuotaError(f"processes survive SIGKILL in cgroup {self.dir}: {self.pids()}")
            time.sleep(next(waits))

    def _keyed(self, name: str) -> dict[str, int]:
        """A flat-keyed cgroup file (``cpu.stat``, ``memory.events``) as a dict."""
        path = self.dir / name
        if not path.exists():
            return {}
        pairs = (line.split() for line in path.read_text().splitlines() if line.strip())
        return {key: int(value) for key, value in pairs}

    def cpu_seconds(self) -> float:
        """``usage_usec`` of ``cpu.stat`` in seconds (the whole subtree)."""
        return self._keyed("cpu.stat").get("usage_usec", 0) / 1e6

    def peak_memory(self) -> int | None:
        """``memory.peak`` (kernel >= 5.19), else None."""
        path = self.dir / "memory.peak"
        return int(path.read_text()) if path.exists() else None

    def oom_killed(self) -> bool:
        """``oom_kill`` of ``memory.events`` (hierarchical: a container's kill counts too)."""
        return self._keyed("memory.events").get("oom_kill", 0) > 0

    def limits(self) -> dict[str, str]:
        """The limits as the kernel reports them, read back from the environment's files."""
        return {
            name: (self.dir / name).read_text().strip()
            for name in LIMIT_FILES
            if (self.dir / name).exists()
        }

    def remove(self) -> None:
        """Kill leftovers and remove the subtree, deepest cgroup first."""
        if not self.dir.exists():
            return
        self.kill()
        for directory in self._subtree():
            reclaim(directory)
            remove_dir(directory)


def reclaim(directory: Path) -> None:
    """``memory.reclaim`` (kernel >= 5.19) of everything ``memory.current`` still charges to
    ``directory``, so that its removal leaves no dying cgroup behind (see CgroupV1.reclaim)."""
    current, knob = directory / "memory.current", directory / "memory.reclaim"
    with contextlib.suppress(OSError, ValueError, QuotaError):  # best effort (EAGAIN: not all)
        charged = int(current.read_text())
        if charged > 0 and knob.exists():
            write_file(knob, str(charged))


def move_processes(service: Path, leaf: str) -> None:
    """Move every process of ``service`` into its child ``leaf`` (created if needed).

    A delegated service's own processes must leave its cgroup before it can give controllers
    to children. New processes forked meanwhile are caught by the next round.
    """
    target = service / leaf
    target.mkdir(exist_ok=True)
    for _ in range(MOVE_ROUNDS):
        pids = (service / "cgroup.procs").read_text().split()
        if not pids:
            return
        for pid in pids:
            try:
                (target / "cgroup.procs").write_text(pid)
            except OSError as exc:
                if exc.errno != errno.ESRCH:  # a process that exited meanwhile is fine
                    raise QuotaError(f"cannot move process {pid} to {target}: {exc}") from exc
    raise QuotaError(f"processes keep appearing in {service}; cannot empty it into {leaf}")
