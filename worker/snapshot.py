"""A workspace's snapshot: what the runner compares to prove a staged mode left it intact."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from workloads.oracle import file_states

Snapshot = dict[str, tuple[Any, ...]]


def snapshot(root: Path) -> Snapshot:
    """Every entry under ``root``: kind, permission bits and, for files, size and SHA-256 (the
    large files hashed in parallel, ``workloads.oracle.file_states``)."""
    entries: Snapshot = {}
    files: list[tuple[str, os.stat_result]] = []
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(directory, name)
            info = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(info.st_mode):
                entries[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                files.append((str(path), info))
                entries[rel] = ("file", info.st_mode, info.st_size)
            else:
                entries[rel] = ("other", info.st_mode)
    for (file, _), state in zip(files, file_states(files), strict=True):
        name = str(Path(file).relative_to(root))
        entries[name] = (*entries[name], state.sha256)
    return entries


def snapshot_diff(before: Snapshot, after: Snapshot) -> list[str]:
    """What changed between two snapshots, one line per path."""
    changes = [f"missing {p}" for p in sorted(before.keys() - after.keys())]
    changes += [f"extra {p}" for p in sorted(after.keys() - before.keys())]
    both = sorted(before.keys() & after.keys())
    changes += [f"changed {p}" for p in both if before[p] != after[p]]
    return changes
