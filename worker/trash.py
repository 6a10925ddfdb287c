"""Deferred removal where a deletion slows later creates: the work root's trash.

On ext4 without a journal (``worker.hostinfo.NO_JOURNAL``) an inode freed in the last 30 s (5
min 30 s while its inode table block is dirty) is not reused, and every create walks past each
such inode: deleting an environment's files at its cleanup slows the next environments' copies
and their measured creates, and metadata results drift with the run order
(``benchmarks/inode_reuse.py``). There, an environment's directory is not deleted at cleanup but
renamed into ``<work root>/trash/`` (one rename; its write-back is in the syncfs after it), so
a campaign frees no inode of its own workspaces while it runs. Its large files
(``LARGE_FILE_BYTES``) are deleted all the same: each frees one inode, which no later create
notices, and most of the space, which the trash would otherwise hold (the full-scale
working-set workloads leave 1-2 GiB an environment in a few files: a full campaign's trash
passed its budget on them and put a 12 s emptying in one cleanup). Where the next environment
is being prepared meanwhile (``defer_large``), the directory is trashed as ``<name>.large``
and its large files are deleted while the cleanup waits for that preparation
(``delete_large_while``, a file at a time, its directory renamed without ``.large`` once none
is left), else before the rename. The trash is emptied:

* when it has grown past its budget: the file system's free space or free inodes fell by more
  than ``BUDGET_SHARE`` of what was free when the trash was started (the space of anything else
  written meanwhile counts too, so it is emptied early, never late), or below
  ``FLOOR_SHARE`` of the whole file system, and deleting the large files it still holds does
  not bring it back under. Then the penalty lands once, in that environment's cleanup;
* by ``sandbench host clean`` (and by nothing else: a worker's start leaves it).

Elsewhere (a journal, Btrfs, tmpfs) the directory is deleted at once, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from worker.hostinfo import NO_JOURNAL, work_root_journal
from worker.workroot import remove_tree, rmtree_parallel, unmount_below

TRASH_DIR = "trash"  # under the work root
SINCE_FILE = ".since.json"  # the file system's free space and inodes when the trash started
BUDGET_SHARE = 0.25
FLOOR_SHARE = 0.10
# A regular file with at least this much allocated is deleted rather than trashed: one freed
# inode per MiB at most, against thousands in a tree of small files.
LARGE_FILE_BYTES = 1 << 20
LARGE_SUFFIX = ".large"  # a trashed directory whose large files are still to be deleted


def defers(work_root: Path) -> bool:
    """Whether removals in ``work_root`` go to its trash (its file system is ext4 without a
    journal)."""
    return work_root_journal(work_root) == NO_JOURNAL


def discard(path: Path, work_root: Path, *, defer_large: bool = False) -> list[str]:
    """Remove the environment directory ``path`` (inside ``work_root``): into the trash where
    deletions slow creates, else deleted; the trash is emptied when over its budget. Problems,
    as ``remove_tree`` gives them. ``defer_large``: its large files are left for
    ``delete_large_while`` (the caller waits for the next environment's preparation next)."""
    if not defers(work_root):
        return remove_tree(path, work_root)
    problems = [f"unmount {m}: errno {e}" for m, e in unmount_below(path.resolve()) if e]
    trash = work_root / TRASH_DIR
    since = trash / SINCE_FILE
    if not defer_large:
        delete_large_files(path)
    try:
        trash.mkdir(exist_ok=True)
        if not since.exists():
            free = os.statvfs(work_root)
            since.write_text(json.dumps({"bytes": _free_bytes(free), "inodes": free.f_favail}))
        suffix = LARGE_SUFFIX if defer_large else ""
        path.rename(trash / f"{path.name}-{time.time_ns()}{suffix}")
    except OSError:  # another file system below the work root, a full disk: delete it now
        return problems + remove_tree(path, work_root)
    if over_budget(work_root):
        delete_large_while(work_root, lambda: True)
        if over_budget(work_root):
            problems += empty(work_root)
    return problems


def delete_large_while(work_root: Path, busy: Callable[[], bool]) -> bool:
    """Delete the large files of the trashed directories still marked ``.large``, a file at a
    time, while ``busy()``; each directory done loses its mark. Whether none is left."""
    trash = work_root / TRASH_DIR
    try:
        marked = sorted(p for p in trash.iterdir() if p.name.endswith(LARGE_SUFFIX))
    except OSError:  # no trash
        return True
    for directory in marked:
        if not busy():
            return False
        if delete_large_files(directory, busy) is None:
            return False
        with contextlib.suppress(OSError):  # a rename that fails leaves the mark: walked again
            directory.rename(directory.with_name(directory.name.removesuffix(LARGE_SUFFIX)))
    return True


def delete_large_files(path: Path, busy: Callable[[], bool] = lambda: True) -> int | None:
    """Unlink every regular file below ``path`` with at least ``LARGE_FILE_BYTES`` allocated
    (a hole costs nothing to keep); how many, or None if ``busy()`` turned false first (asked
    before each directory and each file). No link is followed and no other file system is
    entered; a file that cannot be unlinked stays for the trash."""
    try:
        device = os.lstat(path).st_dev
    except OSError:
        return 0
    deleted, stack = 0, [str(path)]
    while stack:
        if not busy():
            return None
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                    if info.st_dev != device:
                        continue
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
                    elif stat.S_ISREG(info.st_mode) and info.st_blocks * 512 >= LARGE_FILE_BYTES:
                        if not busy():
                            return None
                        os.unlink(entry.path)
                        deleted += 1
                except OSError:  # gone, or not ours to unlink: it stays for the trash
                    continue
    return deleted


def over_budget(work_root: Path) -> bool:
    """Whether the trash of ``work_root`` must be emptied now (see the module's text)."""
    try:
        since = json.loads((work_root / TRASH_DIR / SINCE_FILE).read_text())
        start_bytes, start_inodes = int(since["bytes"]), int(since["inodes"])
    except (OSError, ValueError, KeyError, TypeError):  # unreadable: empty it, start anew
        return True
    now = os.statvfs(work_root)
    floor_bytes, floor_inodes = now.f_blocks * now.f_frsize, now.f_files
    return (
        start_bytes - _free_bytes(now) > BUDGET_SHARE * start_bytes
        or start_inodes - now.f_favail > BUDGET_SHARE * start_inodes
        or _free_bytes(now) < FLOOR_SHARE * floor_bytes
        or now.f_favail < FLOOR_SHARE * floor_inodes
    )


def empty(work_root: Path) -> list[str]:
    """Delete everything in ``work_root``'s trash; what could not be deleted."""
    trash = work_root / TRASH_DIR
    if not trash.is_dir():
        return []
    rmtree_parallel(trash)
    with contextlib.suppress(FileNotFoundError):
        if any(trash.iterdir()):
            return [f"could not empty {trash}"]
    return []


def held(work_root: Path) -> int:
    """How many removed environments' directories the trash of ``work_root`` holds."""
    trash = work_root / TRASH_DIR
    return sum(1 for p in trash.iterdir() if p.is_dir()) if trash.is_dir() else 0


def _free_bytes(st: os.statvfs_result) -> int:
    return st.f_bavail * st.f_frsize
