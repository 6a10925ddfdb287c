"""A workspace's snapshot: what the runner compares to prove a staged mode left it intact."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

HASH_CHUNK = 1 << 20
Snapshot = dict[str, tuple[Any, ...]]


def snapshot(root: Path) -> Snapshot:
    """Every entry under ``root``: kind, permission bits and, for files, size and SHA-256."""
    entries: Snapshot = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(directory, name)
            info = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(info.st_mode):
                entries[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                entries[rel] = ("file", info.st_mode, info.st_size, _sha256(path))
            else:
                entries[rel] = ("other", info.st_mode)
    return entries


def snapshot_diff(before: Snapshot, after: Snapshot) -> list[str]:
    """What changed between two snapshots, one line per path."""
    changes = [f"missing {p}" for p in sorted(before.keys() - after.keys())]
    changes += [f"extra {p}" for p in sorted(after.keys() - before.keys())]
    both = sorted(before.keys() & after.keys())
    changes += [f"changed {p}" for p in both if before[p] != after[p]]
    return changes


def _sha256(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
