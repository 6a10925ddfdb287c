"""The abstraction every cgroup version implements, and what the versions share.

``Cgroup`` is the one abstraction of an environment's cgroup (quota, accounting, kill);
``worker.cgroups.v1.CgroupV1`` and ``worker.cgroups.v2.CgroupV2`` implement it, and
``worker.cgroups`` picks the one this host uses. Both import only this module, so neither
implementation imports the module that chooses between them.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path

from contract.errors import QuotaError
from contract.names import NAME_CHARS
from contract.records import Quota

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT_NAME = "sandbench"  # every environment's cgroup lives under /sandbench
CFS_PERIOD_US = 100_000  # 100 ms, the kernel's default CFS period
KILL_WAIT_S = 5.0  # how long a killed tree may take to disappear
POLL_S = 0.01
FIRST_POLL_S = 0.0005  # a killed process is usually gone within a millisecond
MAX_NAME = 200  # cgroup directory names are file names: keep them well below 255


class Cgroup(ABC):
    """One environment's cgroup: limits from a ``Quota``, accounting, kill and removal."""

    version: int
    placement = "root"  # v2 under a delegated service: "delegated"

    def __init__(self, path: str) -> None:
        self.path = path  # relative to the hierarchy root, e.g. "/sandbench/c1_local_native_0"
        self._preexec_fds: list[int] = []

    @abstractmethod
    def create(self, quota: Quota | None) -> None:
        """Create the cgroup (and its parents) and apply ``quota`` (None: no limits)."""

    @abstractmethod
    def join_paths(self) -> list[Path]:
        """The files whose write of "0" moves the writing process in (written by a process
        with one thread: in v1 it is the thread that moves)."""

    def join_fds(self) -> list[int]:
        """Open file descriptors whose write of "0" moves the writing process into the cgroup."""
        return [os.open(path, os.O_WRONLY) for path in self.join_paths()]

    @abstractmethod
    def pids(self) -> list[int]:
        """Process ids currently in the cgroup."""

    @abstractmethod
    def kill(self) -> None:
        """SIGKILL every process of the cgroup and wait until it is empty."""

    @abstractmethod
    def cpu_seconds(self) -> float:
        """CPU time (user + system) used by the cgroup's processes so far."""

    @abstractmethod
    def peak_memory(self) -> int | None:
        """Peak memory use in bytes (None if this kernel cannot tell)."""

    @abstractmethod
    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer killed a process of this cgroup."""

    @abstractmethod
    def limits(self) -> dict[str, str]:
        """The limits as the kernel reports them, read back from the cgroup's files."""

    @abstractmethod
    def remove(self) -> None:
        """Kill what is left and remove the cgroup directories; safe to call twice."""

    def holds(self, pid: int) -> bool | None:
        """Whether process ``pid`` is in this cgroup or below it in every hierarchy the quota
        uses (None: the process is gone)."""
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return None
        inside = self.path.rstrip("/") + "/"
        return all((where + "/").startswith(inside) for where in self.placement_of(text))

    @abstractmethod
    def placement_of(self, proc_cgroup: str) -> list[str]:
        """A process's cgroup paths in the hierarchies the quota uses, from /proc/PID/cgroup."""

    def facts(self) -> dict[str, object]:
        """Provenance of the cgroup: version, path, placement and the limits read back."""
        return {"version": self.version, "path": self.path, "placement": self.placement,
                "limits": self.limits()}  # fmt: skip

    def preexec(self) -> Callable[[], None]:
        """A ``preexec_fn`` for ``subprocess.Popen`` that joins the child before it execs.

        The files are opened here, in the parent, so the child only does ``os.write`` between
        fork and exec (no allocation, no locks).
        """
        fds = self.join_fds()

        def _join() -> None:
            for fd in fds:
                os.write(fd, b"0")

        self._preexec_fds = fds
        return _join

    def close_preexec(self) -> None:
        """Close the descriptors opened by ``preexec`` (call after the spawn)."""
        for fd in self._preexec_fds:
            os.close(fd)
        self._preexec_fds = []

    def wait_empty(self, deadline_ns: int) -> bool:
        """Wait until no process is left in the cgroup or ``deadline_ns`` (monotonic) passes."""
        waits = poll_waits()
        while self.pids():
            if time.monotonic_ns() >= deadline_ns:
                return False
            time.sleep(next(waits))
        return True


def poll_waits() -> Iterator[float]:
    """The pauses between two looks at a cgroup that is emptying: from ``FIRST_POLL_S``,
    doubling up to ``POLL_S`` (a fixed 10 ms made every kill of a tree that was already
    exiting, such as bubblewrap's init after its payload, cost 10 ms)."""
    wait = FIRST_POLL_S
    while True:
        yield wait
        wait = min(2 * wait, POLL_S)


def cgroup_name(key: str) -> str:
    """A unique, file-name-safe cgroup name for the environment with idempotency ``key``."""
    slug = re.sub(f"[^{NAME_CHARS}]", "_", key)[:MAX_NAME]  # a spec's key is names and '/'s
    return f"{slug}-{secrets.token_hex(3)}"


def cgroup_mounts() -> dict[str, Path]:
    """Mounted cgroup hierarchies: v1 controller name -> mount point, and "cgroup2" -> mount."""
    mounts: dict[str, Path] = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point, fstype, options = Path(fields[1]), fields[2], fields[3].split(",")
        if fstype == "cgroup2":
            mounts.setdefault("cgroup2", point)
        elif fstype == "cgroup":
            for option in options:
                mounts.setdefault(option, point)
    return mounts


def detect() -> int:
    """The cgroup version that carries the controllers here: 1 or 2 (QuotaError if neither)."""
    mounts = cgroup_mounts()
    v1_needed = ("cpu", "cpuacct", "cpuset", "memory", "pids")
    if all(name in mounts for name in v1_needed):
        return 1
    if "cgroup2" in mounts:
        controllers = (mounts["cgroup2"] / "cgroup.controllers").read_text().split()
        if {"cpu", "cpuset", "memory"} <= set(controllers):
            return 2
    raise QuotaError(
        "no usable cgroup hierarchy: need cgroup v1 (cpu, cpuacct, cpuset, memory, pids) or "
        "cgroup v2 with the cpu, cpuset and memory controllers; mount them (run as root)"
    )


def cpu_list(cpus: str) -> list[int]:
    """CPU numbers of a cpuset list such as ``"0,1"`` or ``"0-3,6"``."""
    result: list[int] = []
    for raw in cpus.split(","):
        part = raw.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        result.extend(range(int(low), int(high or low) + 1))
    return result


def write_file(path: Path, value: str) -> None:
    """Write a cgroup control file, naming the file and value on failure."""
    try:
        path.write_text(value)
    except OSError as exc:
        raise QuotaError(f"cannot write {value!r} to {path}: {exc.strerror}") from exc


def remove_dir(path: Path) -> None:
    """Remove an empty cgroup directory, retrying while the kernel releases exited tasks."""
    deadline = time.monotonic() + KILL_WAIT_S
    while path.exists():
        try:
            path.rmdir()
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise QuotaError(f"cannot remove cgroup {path}: {exc.strerror}") from exc
            time.sleep(POLL_S)


KMSG = Path("/dev/kmsg")
KMSG_RECORD_BYTES = 8192  # one read of /dev/kmsg returns one record, at most this long


def oom_kill_logged(cgroup_path: str) -> bool | None:
    """Whether the kernel's log records an OOM kill of a task in ``cgroup_path`` or below it.

    A kill in a sandbox's own memory cgroup below the environment's (a container's) is counted
    on cgroup v1 only there, and that cgroup is gone once the runtime has stopped the container;
    the kernel's report of the kill still names it (``task_memcg=/sandbench/<env>/...``), and
    the environment's cgroup name is never reused. None where the log cannot be read.
    """
    inside = (f"task_memcg={cgroup_path.rstrip('/')}/", f"task_memcg={cgroup_path.rstrip('/')},")
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        while True:
            try:
                record = os.read(fd, KMSG_RECORD_BYTES)
            except BlockingIOError:  # the end of the buffer
                return False
            except BrokenPipeError:  # records overwritten while reading: read on
                continue
            except OSError:
                return None
            if not record:
                return False
            text = record.decode(errors="replace")
            if "oom-kill:" in text and any(mark in text for mark in inside):
                return True
    finally:
        os.close(fd)
