"""The work root: an environment's files are removed only inside it, mounts below detached first;
its file system is made durable with one syncfs."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from contract.errors import SandbenchError

MNT_DETACH = 2
# A tree is removed as its subtrees this many levels down (and the files above them), on as
# many threads as the process has CPUs: unlinking is CPU work in the kernel and in Python
# (2.24 s on one thread, 1.27 s on two, ``rm -rf`` 1.86 s, for 24 environments' 45,000 files).
SPLIT_DEPTH = 2
BATCHES_PER_THREAD = 4  # interleaved batches, so one large subtree does not leave a thread idle
# ... except on these file systems, where one thread is faster: Btrfs serialises the unlinks of
# one subvolume on its tree's locks, and two threads took 0.26-0.28 s for a reflinked copy of
# 10,000 small files against 0.16-0.17 s on one (2026-12-07, a loop-mounted Btrfs).
SERIAL_REMOVAL = frozenset({"btrfs"})


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
    rmtree_parallel(path)
    if os.path.lexists(path):
        problems.append(f"could not remove {path}")
    return problems


def rmtree_parallel(path: Path) -> None:
    """``shutil.rmtree(path, ignore_errors=True)`` on all the process's CPUs.

    The subtrees ``SPLIT_DEPTH`` levels below ``path`` and the files above them go first, in
    batches on a thread pool (each subtree by ``shutil.rmtree``, which never follows a symbolic
    link); then ``shutil.rmtree`` removes what is left. No link is followed anywhere: an entry
    is a subtree only if it is a directory itself, and a link is unlinked like a file. For
    unmeasured phases only (cleanup, the trash, the reaper): it takes every CPU it may use.
    """
    workers = len(os.sched_getaffinity(0))
    real_dir = path.is_dir() and not path.is_symlink()  # a link is rmtree's to refuse
    split = workers > 1 and real_dir and not removes_serially(os.stat(path).st_dev, path)
    parts = _parts(path, SPLIT_DEPTH) if split else []
    if len(parts) > 1:
        count = min(len(parts), workers * BATCHES_PER_THREAD)
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(_remove_parts, [parts[i::count] for i in range(count)]))
    shutil.rmtree(path, ignore_errors=True)


def removes_serially(device: int, path: Path) -> bool:
    """Whether removals on the file system ``device`` (holding ``path``) are done on one thread
    (``SERIAL_REMOVAL``): its type read once per device."""
    if device not in _SERIAL:
        from worker.hostinfo import filesystem_of

        _SERIAL[device] = filesystem_of(path)["type"] in SERIAL_REMOVAL
    return _SERIAL[device]


_SERIAL: dict[int, bool] = {}


def _parts(path: Path, depth: int) -> list[tuple[str, bool]]:
    """(path, is a directory) of the directories ``depth`` levels below ``path`` and of every
    other entry above them; an unreadable directory is left to the final ``rmtree``."""
    parts: list[tuple[str, bool]] = []
    level = [str(path)]
    for _ in range(depth):
        below: list[str] = []
        for directory in level:
            try:
                with os.scandir(directory) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            below.append(entry.path)
                        else:
                            parts.append((entry.path, False))
            except OSError:
                continue
        level = below
    return parts + [(directory, True) for directory in level]


def _remove_parts(parts: list[tuple[str, bool]]) -> None:
    """Remove each part: a directory's tree, or one entry that is not a directory."""
    for part, is_dir in parts:
        if is_dir:
            shutil.rmtree(part, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(part)


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
