"""The 4 working-set workloads on the host side: sparse fixture files and the final contents."""

from __future__ import annotations

import hashlib
from pathlib import Path

from workloads import payload as pl
from workloads.base import FileState, ModelState

Params = dict[str, int]


def build_working_set(dest: Path, seed: int, p: Params) -> None:
    """The working-set files, sparse, at their full size."""
    (dest / "ws").mkdir()
    for i in range(p["files"]):
        with open(dest / "ws" / f"file-{i}.bin", "wb") as f:
            f.truncate(p["file_bytes"])


def evolve_working_set(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Each block holds its last write (a slice of the seeded base buffer); untouched are zero."""
    if not rounds:
        return
    last = pl.ws_last_writes(seed, rounds, p)
    base = memoryview(pl.ws_base(seed, p))
    bs, per_file = p["block_bytes"], p["file_bytes"] // p["block_bytes"]
    zero = bytes(bs)
    for i in range(p["files"]):
        h = hashlib.sha256()
        for block in range(i * per_file, (i + 1) * per_file):
            src = last.get(block)
            h.update(zero if src is None else base[src : src + bs])
        s.files[f"ws/file-{i}.bin"] = FileState(p["file_bytes"], h.hexdigest())
