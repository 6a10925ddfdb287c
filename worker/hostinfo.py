"""Facts about this host: CPU, memory, kernel, work root filesystem, cgroup version, tools."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from workloads.fixtures import PLAIN_COPY, REFLINK, reflink_works

TOOL_TIMEOUT_S = 10
CGROUP_ROOT = Path("/sys/fs/cgroup")
NO_JOURNAL = "ext4 without a journal"
NO_JOURNAL_WARNING = (
    "The work root is on ext4 without a journal: it does not reuse an inode freed in the last "
    "30 s (5 min 30 s while its inode table block is dirty) and every create walks past each "
    "one, so earlier environments' deletions (cleanup, a workload's own) slow later creates: "
    "metadata cells (create-small, copies, builds) may drift with the run order for that "
    "reason (benchmarks/inode_reuse.py). A work root on a journaled file system does not."
)


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_bytes() -> int:
    """Total memory of the host in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def filesystem_of(path: Path) -> dict[str, str]:
    """Mount point, filesystem type and source of the mount holding ``path``."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    target = os.path.realpath(path)
    best = {"mount_point": "/", "type": "unknown", "source": "unknown"}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        mount_point = left.split()[4].replace("\\040", " ")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best["mount_point"]):
            fstype, source = ([*right.split(), "", ""])[:2]
            best = {"mount_point": mount_point, "type": fstype, "source": source}
    return best


def ext4_journal(path: Path) -> bool | None:
    """Whether the ext4 file system holding ``path`` has a journal; None if it is not ext4.

    Read from ``/sys/fs/ext4/<device>/journal_task`` (``<none>`` without a journal).
    """
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    dev = os.stat(path).st_dev
    device = Path(os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")).name
    try:
        task = (Path("/sys/fs/ext4") / device / "journal_task").read_text().strip()
    except OSError:  # not ext4 (or a kernel without the attribute)
        return None
    return task != "<none>"


def work_root_journal(work_root: Path) -> str:
    """The work root's file system and its journal, as the record's host facts say it.

    ``ext4 without a journal`` matters to metadata results: such an ext4 does not reuse an inode
    freed in the last 30 s (5 min 30 s while its inode table block is dirty) and walks past
    each of them on every create, so deletions (the previous environments' cleanup, a
    workload's own) slow the creates of the environments after them
    (``benchmarks/inode_reuse.py``).
    """
    journal = ext4_journal(work_root)
    if journal is None:
        return filesystem_of(work_root)["type"]
    return "ext4 with a journal" if journal else NO_JOURNAL


def workspace_copy(work_root: Path) -> str:
    """How workspaces are copied from fixtures in ``work_root``: ``reflink`` or ``copy``."""
    if not Path(work_root).is_dir():
        return "unknown (the work root does not exist yet)"
    try:
        return REFLINK if reflink_works(Path(work_root)) else PLAIN_COPY
    except OSError as exc:  # a read-only or full work root: the environments will say more
        return f"unknown ({exc.strerror})"


def cgroup_version() -> str:
    """``v2`` (unified), ``v1`` or ``hybrid`` (v1 controllers plus an empty v2 tree)."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return "v2"
    if (CGROUP_ROOT / "unified" / "cgroup.controllers").exists():
        return "hybrid (v1 controllers, empty v2 at /sys/fs/cgroup/unified)"
    return "v1"


def tool_version(argv: list[str]) -> str | None:
    """First line of a tool's version output, or None when it is not installed."""
    exe = shutil.which(argv[0]) or (
        f"/usr/sbin/{argv[0]}" if Path(f"/usr/sbin/{argv[0]}").exists() else None
    )
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, *argv[1:]], check=False, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else None


def tool_versions(tools: dict[str, list[str]]) -> dict[str, str | None]:
    """Version line of every tool (name -> version command); None when it is missing."""
    return {name: tool_version(argv) for name, argv in tools.items()}


def host_facts(work_root: Path, tools: dict[str, list[str]]) -> dict[str, Any]:
    """Every hardware and system fact of this host that a result depends on, with ``tools``."""
    affinity = sorted(os.sched_getaffinity(0))
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "cpu_affinity": ",".join(map(str, affinity)),
        "memory_bytes": memory_bytes(),
        "kernel": platform.release(),
        "os": _os_release(),
        "work_root": str(work_root),
        "work_root_fs": filesystem_of(work_root),
        "work_root_journal": work_root_journal(work_root),
        "workspace_copy": workspace_copy(work_root),
        "cgroup": cgroup_version(),
        "accelerator": accelerator(),
        "tools": tool_versions(tools),
    }


def accelerator() -> dict[str, object]:
    """The VM accelerator verdict cached by the probe, with KVM's reason on a fallback."""
    from worker.vm import accel, guest

    return accel.host_facts(guest.load_guest())


def _os_release() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.platform()
