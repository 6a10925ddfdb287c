"""What environments of a work root can leave behind, and a payload interpreter that holds one.

``holding_python`` writes a stand-in for the payload's interpreter (``SANDBENCH_PYTHON``): it
starts a stray child in the environment's cgroup, waits the seconds named in the work root's
``hold-s`` file, then runs the real payload. So a test can kill a runner or a worker in the
middle of a prepared environment (workspace copied, cgroups created, a staged overlay mounted,
processes running) and then look for what survived. With a ``fill-disk`` file in the work root
it first fills the workspace's file system, so the payload's writes fail with ENOSPC.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import psutil

from tests.fleet_helpers import wait_until
from worker.cgroups import PARENT_NAME, cgroup_mounts, detect
from worker.ledger import ENVS_DIR, LEDGER_DIR

HOLD_FILE = "hold-s"
FILL_FILE = "fill-disk"  # present in the work root: the environment fills its disk first
STRAY_S = 1000  # the stray child's sleep: it outlives any test unless something kills it
HOLDING_PYTHON = f"""#!/bin/sh
# A payload interpreter that holds the environment (tests/leftovers.py).
case "$3" in --version) exec /usr/bin/python3 "$@";; esac
ws=""; prev=""
for a in "$@"; do [ "$prev" = "--root" ] && ws="$a"; prev="$a"; done
root="${{ws%%/{ENVS_DIR}/*}}"
hold=$(cat "$root/{HOLD_FILE}" 2>/dev/null || echo 0)
[ -e "$root/{FILL_FILE}" ] && dd if=/dev/zero of="$ws/.fill" bs=1M 2>/dev/null
sleep {STRAY_S} &
sleep "$hold"
exec /usr/bin/python3 "$@"
"""


def holding_python(directory: Path) -> Path:
    """Write the holding interpreter into ``directory``; its path."""
    path = directory / "holding-python"
    path.write_text(HOLDING_PYTHON)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def hold(work_root: Path, seconds: float) -> None:
    """Make environments of ``work_root`` that start from now on wait ``seconds`` before Ready."""
    (work_root / HOLD_FILE).write_text(f"{seconds:g}\n")


def env_names(work_root: Path) -> list[str]:
    """Names (directory and cgroup name) of the environments present under ``work_root``."""
    envs = work_root / ENVS_DIR
    return sorted(p.name for p in envs.iterdir()) if envs.is_dir() else []


def cgroup_parents() -> list[Path]:
    """Where environment cgroups go: ``/sandbench`` in every mounted hierarchy, and on cgroup v2
    under a delegated service (this process's) its ``envs`` directory."""
    mounts = cgroup_mounts()
    parents = {point / PARENT_NAME for point in mounts.values()}
    if detect() == 2:
        from worker.cgroups.v2 import placement

        parents.add(mounts["cgroup2"] / placement().parent.strip("/"))
    return sorted(parents)


def cgroup_dirs(prefix: str) -> list[Path]:
    """Environment cgroups whose name starts with ``prefix``, in every mounted hierarchy."""
    found: list[Path] = []
    for parent in cgroup_parents():
        if parent.is_dir():
            found += sorted(d for d in parent.iterdir() if d.name.startswith(prefix))
    return found


def cgroup_pids(dirs: list[Path]) -> set[int]:
    """Processes in the cgroups ``dirs`` and below them."""
    pids: set[int] = set()
    for top in dirs:
        for directory, _subdirs, _files in os.walk(top):
            try:
                pids |= {int(p) for p in Path(directory, "cgroup.procs").read_text().split()}
            except OSError:
                continue
    return pids


def mounts_under(path: Path) -> list[str]:
    """Mount points strictly below ``path``."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    points = (line.split()[4].encode().decode("unicode_escape") for line in lines)
    return sorted(p for p in points if p.startswith(f"{path}/"))


def leftovers(work_root: Path, prefix: str) -> dict[str, list[str]]:
    """Everything environments of ``work_root`` (cgroups named ``prefix``...) left behind."""
    groups = cgroup_dirs(prefix)
    pids = cgroup_pids(groups)
    envs = str(work_root / ENVS_DIR)  # a payload's --root (a worker's --work-root is not this)
    for proc in psutil.process_iter(["cmdline"]):
        if any(envs in arg for arg in proc.info["cmdline"] or []):
            pids.add(proc.pid)
    ledger = work_root / LEDGER_DIR
    return {
        "processes": [_describe(pid) for pid in sorted(pids)],
        "cgroups": [str(d) for d in groups],
        "mounts": mounts_under(work_root),
        "files": [str(work_root / ENVS_DIR / n) for n in env_names(work_root)]
        + ([str(p) for p in sorted(ledger.iterdir())] if ledger.is_dir() else []),
    }


def holding(work_root: Path, timeout: float = 60) -> str:
    """Wait until an environment of ``work_root`` has its overlay mounted and holds (the stray
    child runs in its cgroup, the interpreter waits); its name."""

    def ready() -> str | None:
        for name in env_names(work_root):
            merged = work_root / ENVS_DIR / name / "env" / "stage" / "merged"
            if merged.is_mount() and _stray_in(cgroup_pids(cgroup_dirs(name))):
                return name
        return None

    return wait_until(ready, timeout, f"an environment holding in {work_root}", 0.05)


def _stray_in(pids: set[int]) -> bool:
    """Whether the holding interpreter's stray child is among ``pids`` (then it holds)."""
    for pid in pids:
        try:
            if psutil.Process(pid).cmdline() == ["sleep", str(STRAY_S)]:
                return True
        except psutil.Error:
            continue
    return False


def release(name: str) -> None:
    """End the wait of the holding environment ``name`` now: its payload starts."""
    for pid in cgroup_pids(cgroup_dirs(name)):
        try:
            proc = psutil.Process(pid)
            argv = proc.cmdline()
            if argv[:1] == ["sleep"] and argv != ["sleep", str(STRAY_S)]:
                proc.kill()
        except psutil.Error:
            continue


def runs(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie waiting for its parent."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


NOTHING = {"processes": [], "cgroups": [], "mounts": [], "files": []}  # leftovers() of a clean root


def _describe(pid: int) -> str:
    """``pid`` and its command line, for assertion messages."""
    try:
        return f"{pid} {' '.join(psutil.Process(pid).cmdline())}"
    except psutil.Error:
        return f"{pid} (gone)"
