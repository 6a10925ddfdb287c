"""A workspace's snapshot: what the runner compares to prove a staged mode left it intact."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import sys
from collections.abc import Collection, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from workloads.kit import FileState
from workloads.oracle import HASH_CHUNK, file_states, scan_cached

Snapshot = dict[str, tuple[Any, ...]]
HOLES = "holes:"  # a digest of ``holes_digest``
# A tree of this many entries is snapshotted by a process of its own (``snapshot_apart``): a
# walk that opens and hashes thousands of small files holds the GIL between short system
# calls, and on a thread beside the oracle's walk of the result root the two slowed each other
# to twice their serial time (staged delete-tree: 0.5 s against 0.26 s serial and 0.24 s in a
# separate process); below it, a Python start (about 50 ms) costs more than it saves.
APART_ENTRIES = 1000
APART_TIMEOUT_S = 600.0


def snapshot(
    root: Path,
    known: Mapping[str, FileState] | None = None,
    *,
    holes: bool = False,
    like: Snapshot | None = None,
) -> Snapshot:
    """Every entry under ``root``: kind, permission bits and, for files, size and SHA-256 (the
    large files hashed in parallel, ``workloads.oracle.file_states``).

    ``known``: the states (path -> size, SHA-256) of the tree ``root`` was copied from with
    ``cp -a`` (a fixture, as the oracle's cached scan has them): a file of the same path and
    size takes its hash from there instead of being read again. Every entry is still walked
    and its kind, bits and size taken here; the check after the run hashes every byte (of a
    sparse file: every byte of its data), so a copy that differed from its fixture shows there
    as a change, never as intact.

    ``holes``: a sparse file (fewer bytes allocated than its size) gets ``holes_digest``
    instead, which reads its data and not its holes; ``like``: a snapshot taken before, whose
    kind of digest each file gets again (so a check after compares like with like)."""
    return _snapshot(root, known or {}, holes, None if like is None else hole_paths(like))


def fixture_snapshot(fixture: Path, ignore: tuple[str, ...] = ()) -> Snapshot:
    """``snapshot(fixture, holes=True)``, its files' hashes from the oracle's cached scan (under
    the workload's ``ignore``), kept per fixture (by path and the root's device, inode and
    change time, as that scan: a fixture never changes once built, and one built again is
    snapshotted afresh). A workspace copied from the fixture (``cp -a``: names, kinds,
    permission bits, bytes and holes) has this snapshot too, so it is the original's state
    before the run without walking every copy; a copy that differed from its fixture shows in
    the check after the run as a change. Shared by every caller: never changed."""
    st = os.stat(fixture)
    return _fixture_snapshot(str(fixture), (st.st_dev, st.st_ino, st.st_ctime_ns), ignore)


@lru_cache(maxsize=32)
def _fixture_snapshot(
    root: str, identity: tuple[int, int, int], ignore: tuple[str, ...]
) -> Snapshot:
    """``fixture_snapshot`` memoized by path and the root directory's identity."""
    known, _ = scan_cached(Path(root), ignore)
    return snapshot(Path(root), known, holes=True)


def hole_paths(like: Snapshot) -> frozenset[str]:
    """The files of snapshot ``like`` that have the hole-aware digest."""
    return frozenset(rel for rel, entry in like.items()
                     if entry[0] == "file" and str(entry[-1]).startswith(HOLES))  # fmt: skip


def _snapshot(
    root: Path, known: Mapping[str, FileState], holes: bool, like: Collection[str] | None
) -> Snapshot:
    """``snapshot``, ``like`` given as the files that take the hole-aware digest again."""
    entries: Snapshot = {}
    files: list[tuple[str, os.stat_result]] = []
    names: list[str] = []  # of ``files``, relative
    top = str(root)
    for directory, dirnames, filenames in os.walk(top):  # paths as strings: no Path per entry
        base = os.path.relpath(directory, top)
        for name in dirnames + filenames:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            rel = name if base == "." else f"{base}/{name}"
            if stat.S_ISLNK(info.st_mode):
                entries[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                state = known.get(rel)
                if _by_holes(rel, info, holes, like):
                    entries[rel] = ("file", info.st_mode, info.st_size, holes_digest(path))
                elif state is not None and state.size == info.st_size:
                    entries[rel] = ("file", info.st_mode, info.st_size, state.sha256)
                else:
                    entries[rel] = ("file", info.st_mode, info.st_size)
                    files.append((path, info))
                    names.append(rel)
            else:
                entries[rel] = ("other", info.st_mode)
    for rel, state in zip(names, file_states(files), strict=True):
        entries[rel] = (*entries[rel], state.sha256)
    return entries


def _by_holes(rel: str, info: os.stat_result, holes: bool, like: Collection[str] | None) -> bool:
    """Whether the file ``rel`` gets ``holes_digest`` (see ``snapshot``)."""
    if like is not None:
        return rel in like
    return holes and info.st_blocks * 512 < info.st_size


def snapshot_after(root: Path, like: Snapshot) -> Snapshot:
    """``snapshot(root, like=like)``: in this process for a small tree, by ``snapshot_apart``
    for one of ``APART_ENTRIES`` entries or more."""
    return snapshot_apart(root, like) if len(like) >= APART_ENTRIES else snapshot(root, like=like)


def snapshot_apart(root: Path, like: Snapshot) -> Snapshot:
    """``snapshot(root, like=like)`` computed by a separate Python process (``main``), which
    walks and hashes beside this one's threads instead of taking turns with them on the GIL;
    raises OSError if it fails."""
    from worker.procs import run_owned

    where = str(Path(__file__).resolve().parents[1])  # the checkout or site-packages
    code = f"import sys; sys.path.insert(0, {where!r}); from worker.snapshot import main; main()"
    argv = [sys.executable, "-I", "-c", code, str(root)]
    done = run_owned(argv, APART_TIMEOUT_S, stdin_text=json.dumps(sorted(hole_paths(like))))
    if done.returncode != 0:
        raise OSError(f"snapshot of {root} in a separate process: {done.stderr.strip()[-500:]}")
    return {rel: tuple(entry) for rel, entry in json.loads(done.stdout).items()}


def main() -> None:
    """``snapshot_apart``'s other side: the files taking the hole-aware digest (a JSON list) on
    standard input, the snapshot of ``argv[1]`` (a JSON object) on standard output."""
    like = frozenset(json.load(sys.stdin))
    json.dump(_snapshot(Path(sys.argv[1]), {}, False, like), sys.stdout)


def holes_digest(path: str) -> str:
    """SHA-256 over a file's data regions (``SEEK_DATA``/``SEEK_HOLE``: offsets and bytes) and its
    size, prefixed ``holes:``; what lies between the regions is not read.

    As strict as the content's hash for telling a file from the same file changed: a hole reads
    as zeros, so the same regions with the same bytes and the same size are the same content,
    and any write changes a region's bytes or the regions. (A change of layout alone, zeros
    written into a hole, shows as a change too: nothing rewrites an original unchanged.) A file
    system without holes reports one region, the whole file: the content's hash."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size, pos = os.fstat(fd).st_size, 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only a hole up to the end
                    break
                raise
            end = os.lseek(fd, start, os.SEEK_HOLE)
            h.update(f"{start}-{end}\n".encode())
            while start < end and (chunk := os.pread(fd, min(HASH_CHUNK, end - start), start)):
                h.update(chunk)
                start += len(chunk)
            pos = end
        h.update(f"size {size}\n".encode())
    finally:
        os.close(fd)
    return HOLES + h.hexdigest()


def snapshot_diff(before: Snapshot, after: Snapshot) -> list[str]:
    """What changed between two snapshots, one line per path."""
    changes = [f"missing {p}" for p in sorted(before.keys() - after.keys())]
    changes += [f"extra {p}" for p in sorted(after.keys() - before.keys())]
    both = sorted(before.keys() & after.keys())
    changes += [f"changed {p}" for p in both if before[p] != after[p]]
    return changes
