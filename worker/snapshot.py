"""A workspace's snapshot: what the runner compares to prove a staged mode left it intact."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workloads.kit import FileState
from workloads.oracle import file_states

Snapshot = dict[str, tuple[Any, ...]]


def snapshot(root: Path, known: Mapping[str, FileState] | None = None) -> Snapshot:
    """Every entry under ``root``: kind, permission bits and, for files, size and SHA-256 (the
    large files hashed in parallel, ``workloads.oracle.file_states``).

    ``known``: the states (path -> size, SHA-256) of the tree ``root`` was copied from with
    ``cp -a`` (a fixture, as the oracle's cached scan has them): a file of the same path and
    size takes its hash from there instead of being read again. Every entry is still walked
    and its kind, bits and size taken here; the check after the run hashes every byte, so a
    copy that differed from its fixture shows there as a change, never as intact."""
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
                if state is not None and state.size == info.st_size:
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


def snapshot_diff(before: Snapshot, after: Snapshot) -> list[str]:
    """What changed between two snapshots, one line per path."""
    changes = [f"missing {p}" for p in sorted(before.keys() - after.keys())]
    changes += [f"extra {p}" for p in sorted(after.keys() - before.keys())]
    both = sorted(before.keys() & after.keys())
    changes += [f"changed {p}" for p in both if before[p] != after[p]]
    return changes
