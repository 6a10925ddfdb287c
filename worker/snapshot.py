"""A workspace's snapshot: what the runner compares to prove a staged mode left it intact."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workloads.kit import FileState
from workloads.oracle import HASH_CHUNK, file_states

Snapshot = dict[str, tuple[Any, ...]]
HOLES = "holes:"  # a digest of ``holes_digest``


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
    entries: Snapshot = {}
    files: list[tuple[str, os.stat_result]] = []
    names: list[str] = []  # of ``files``, relative
    known = known or {}
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


def _by_holes(rel: str, info: os.stat_result, holes: bool, like: Snapshot | None) -> bool:
    """Whether the file ``rel`` gets ``holes_digest`` (see ``snapshot``)."""
    if like is not None:
        before = like.get(rel)
        return before is not None and before[0] == "file" and str(before[-1]).startswith(HOLES)
    return holes and info.st_blocks * 512 < info.st_size


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
