"""The work root: an environment's files are removed only inside it, mounts below detached first;
its file system is made durable with one syncfs."""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

from contract.errors import SandbenchError

MNT_DETACH = 2


def check_work_root(path: Path, option: str = "--work-root") -> Path:
    """``path`` made absolute if it is a directory or can be made one (it or its nearest existing
    parent is a directory); SandbenchError naming the file in the way otherwise."""
    path = path.absolute()
    for existing in (path, *path.parents):
        if os.path.lexists(existing):
            if not existing.is_dir():
                raise SandbenchError(
                    f"{option} {path}: {existing} is not a directory; give a directory (one that "
                    "does not exist yet is created)"
                )
            break
    return path


def remove_tree(path: Path, work_root: Path) -> list[str]:
    """Delete ``path`` (unmounting anything below it first) only if it is inside ``work_root``."""
    path, work_root = path.absolute(), work_root.resolve()
    if path.resolve() == work_root or work_root not in path.resolve().parents:
        raise SandbenchError(f"refusing to delete {path}: not inside the work root {work_root}")
    problems = [f"unmount {m}: errno {e}" for m, e in unmount_below(path.resolve()) if e]
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        problems.append(f"could not remove {path}")
    return problems


def unmount_below(path: Path) -> list[tuple[str, int]]:
    """Detach every mount at or below ``path`` (deepest first); (mount point, errno) each."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == str(path) or point.startswith(str(path) + "/"):
            points.append(point)
    libc = ctypes.CDLL(None, use_errno=True)
    results = []
    for point in sorted(points, key=len, reverse=True):
        failed = libc.umount2(point.encode(), MNT_DETACH) != 0
        results.append((point, ctypes.get_errno() if failed else 0))
    return results


def syncfs(path: Path) -> None:
    """syncfs(2) the file system holding ``path`` (one call instead of an fsync per file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs {path}: {os.strerror(code)}")
    finally:
        os.close(fd)
