"""Whether an environment's work ran inside its cgroup, so the quota its record claims bound.

Two checks, both outside every clock: every process of the launcher's tree is in the
environment's cgroup (or below it) after Ready and after each round's done line, and the
cgroup's CPU time is not implausibly below the CPU time the payload reports for itself
(``getrusage`` of itself and its children, in each done line). A runtime that moves itself or
its children elsewhere (a sandbox that manages cgroups of its own) fails the first; work done
by processes outside the tree (a daemon's) the second. Either ends the environment as
resource/quota-escaped with the check and its numbers in the detail.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import psutil

from worker.cgroups import Cgroup

# The payload's CPU time must exceed the cgroup's by at least this much before a low share
# counts: both clocks tick in microseconds, but a tiny environment's few milliseconds of
# difference (the payload's own start before it could read its clock) are noise.
MIN_GAP_S = 0.05
SHOWN = 5  # processes named in a detail


def outside(cgroup: Cgroup, root_pid: int) -> list[str]:
    """The processes of ``root_pid``'s tree outside ``cgroup``: ``pid name (its cgroup)``."""
    return [
        f"{pid} {_comm(pid)} ({_where(cgroup, pid)})"
        for pid in tree(root_pid)
        if cgroup.holds(pid) is False
    ]


def tree(root_pid: int) -> list[int]:
    """``root_pid`` and its descendants ([] once it is gone).

    Walked down through the kernel's ``/proc/PID/task/TID/children`` (each thread's children;
    only the tree's own processes are read: about 25 us for a launcher and its payload)
    rather than psutil's ``children``, which reads the status of every process on the host to
    find parents (1-3 ms a call with the container engines' daemons running, four calls an
    environment). Where the kernel has no such files (built without ``CONFIG_PROC_CHILDREN``),
    psutil's walk. A process that forks while it is read may show its new child in the next
    check rather than this one, as with psutil's scan.
    """
    if not _children_files():  # the scan of every process
        try:
            root = psutil.Process(root_pid)
            return [root_pid, *(p.pid for p in root.children(recursive=True))]
        except psutil.Error:  # the launcher is gone: nothing of its tree can run elsewhere
            return []
    if not os.path.isdir(f"/proc/{root_pid}/task"):
        return []
    found, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += _children(pid)
    return found


@cache
def _children_files() -> bool:
    """Whether this kernel has ``/proc/PID/task/TID/children``."""
    return os.path.exists("/proc/thread-self/children")


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (none once it is gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as handle:
                kids += [int(x) for x in handle.read().split()]
        except OSError:  # the thread or the process ended meanwhile
            continue
    return kids


def placement_problem(cgroup: Cgroup, root_pid: int, when: str) -> str | None:
    """The quota-escaped detail when a process of the tree runs outside ``cgroup``."""
    escaped = outside(cgroup, root_pid)
    if not escaped:
        return None
    more = len(escaped) - SHOWN
    shown = "; ".join(escaped[:SHOWN]) + (f" and {more} more" if more > 0 else "")
    return (
        f"placement check {when}: {len(escaped)} process(es) of the environment run outside "
        f"its cgroup {cgroup.path}: {shown}"
    )


def cpu_problem(
    cgroup_cpu_s: float, payload_cpu_s: float | None, floor: float, prejoin_cpu_s: float = 0.0
) -> str | None:
    """The quota-escaped detail when the cgroup shows less than ``floor`` of the payload's
    own CPU time (and at least ``MIN_GAP_S`` less).

    ``prejoin_cpu_s`` is what the launched process used before it joined the cgroup (the
    launch shim's start, ``worker.procs.Spawned``): in the payload's own count when the payload
    is that process (native), in the cgroup's never, so it is taken off the payload's count. A
    payload started further down (any sandbox) never counted it, and the check is that much
    more lenient there: about 1 ms on a host, tens under TCG, below ``MIN_GAP_S``.
    """
    if payload_cpu_s is None:
        return None
    payload_in_s = payload_cpu_s - prejoin_cpu_s
    if payload_in_s - cgroup_cpu_s < MIN_GAP_S or cgroup_cpu_s >= floor * payload_in_s:
        return None
    before = f" ({prejoin_cpu_s:.3f} s of it before joining)" if prejoin_cpu_s else ""
    return (
        f"CPU-time check: the environment's cgroup used {cgroup_cpu_s:.3f} s of CPU while the "
        f"payload reports {payload_cpu_s:.3f} s for itself and its children{before} (at "
        f"least {floor:.0%} of what it used after joining expected): its work ran outside the "
        f"quota"
    )


def _comm(pid: int) -> str:
    """A process's command name, or ``?`` once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _where(cgroup: Cgroup, pid: int) -> str:
    """Where a process is, as its /proc/PID/cgroup says for the quota's hierarchies."""
    try:
        return ", ".join(sorted(set(cgroup.placement_of(Path(f"/proc/{pid}/cgroup").read_text()))))
    except OSError:
        return "gone"
