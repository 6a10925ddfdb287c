"""The working-set (resource) workloads: logical 1 GiB of block writes over a working set.

Each round writes ``logical_bytes`` in blocks over 4 sparse files of ``working_set_bytes`` in
total, in a seeded permutation per pass, with N writer threads; every block written is a slice
of one seeded buffer. The buffer and the round's schedule are made ahead, outside the clock.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading

from workloads.kit import (
    PAGE,
    Blocks,
    Declaration,
    GiB,
    KiB,
    MiB,
    ModelState,
    Params,
    ahead,
    io_unit,
    prepare,
    scaled_bytes,
    stream,
    write_all,
)

TYPE_CHECKING = False  # ``pathlib`` is not imported at run time (``workloads.kit``)
if TYPE_CHECKING:
    from pathlib import Path

    from workloads.kit import Check

WS_BLOCK = 64 * KiB  # write unit of the working-set workloads
WS_BASE = MiB  # seeded source buffer the working-set blocks are sliced from
WS_SAMPLES = 64  # blocks read back per round by the in-environment check


def shape(p: Params) -> None:
    """Fix the block size and per-file size (a whole number of blocks) after scaling."""
    per_file = p["working_set_bytes"] // p["files"]
    block = WS_BLOCK if per_file >= WS_BLOCK else PAGE
    p["block_bytes"] = block
    p["file_bytes"] = max(block, per_file // block * block)


def base_label(p: Params) -> str:
    """The label of the seeded buffer every block is a slice of."""
    return f"ws:{p['working_set_bytes']}:{p['writers']}"


# The seeded buffers made so far, kept for the payload's whole life: every round of an
# environment slices the same one, so it is made once (before round 1's clock), not before each
# round (about 3 ms a round for its 1 MiB of SHAKE-256).
_BASES: dict[tuple[int, str], bytes] = {}


def ws_base(seed: int, p: Params) -> bytes:
    """The seeded buffer every block a working-set workload writes is a slice of."""
    key = (seed, base_label(p))
    if key not in _BASES:
        _BASES[key] = stream(seed, key[1], WS_BASE + WS_BLOCK)
    return _BASES[key]


def ws_schedule(seed: int, k: int, p: Params) -> list[tuple[int, int]]:
    """Round ``k``'s writes in order: (global block, offset into the base buffer)."""
    return ahead(("ws-schedule", seed, k, *sorted(p.items())), lambda: _schedule(seed, k, p))


def _schedule(seed: int, k: int, p: Params) -> list[tuple[int, int]]:
    """Compute ``ws_schedule``: one seeded affine permutation of the blocks per pass."""
    blocks = p["files"] * (p["file_bytes"] // p["block_bytes"])
    writes = p["logical_bytes"] // p["block_bytes"]
    slots = (WS_BASE + WS_BLOCK - p["block_bytes"]) // PAGE
    out = []
    for pas in range(-(-writes // blocks)):
        mult, add = _affine(seed, k, pas, blocks)
        for pos in range(min(blocks, writes - pas * blocks)):
            block = (mult * pos + add) % blocks
            out.append((block, ((block * 2654435761 + pas * 97 + k * 1009 + seed) % slots) * PAGE))
    return out


def _affine(seed: int, k: int, pas: int, blocks: int) -> tuple[int, int]:
    """A seeded affine permutation (multiplier coprime with ``blocks``, offset) of one pass."""
    h = int.from_bytes(stream(seed, f"ws:{k}:{pas}", 16), "little")
    mult = (h & 0xFFFFFFFF) % blocks | 1
    while math.gcd(mult, blocks) != 1:
        mult += 2
    return mult, (h >> 64) % blocks


def make_ahead(seed: int, p: Params, k: int) -> None:
    """Make round ``k``'s buffer (once) and schedule before its clock starts."""
    ws_base(seed, p)
    prepare(("ws-schedule", seed, k, *sorted(p.items())), lambda: _schedule(seed, k, p))


def ws_paths(root: str, p: Params) -> list[str]:
    """The working-set files under ``root``."""
    return [os.path.join(root, "ws", f"file-{i}.bin") for i in range(p["files"])]


def working_set(root: str, seed: int, p: Params, k: int) -> Check:
    """Write the round's logical bytes into the working set with N writer threads, fsync.

    Clock: the block writes of every writer thread and the fsync of every file. After it: a
    spread of blocks is read back through fresh descriptors.
    """
    data = ws_base(seed, p)
    base = memoryview(data)  # slices written without a copy
    bs, per_file = p["block_bytes"], p["file_bytes"] // p["block_bytes"]
    schedule = ws_schedule(seed, k, p)
    fds = [os.open(path, os.O_RDWR) for path in ws_paths(root, p)]
    try:
        lanes: list[list[tuple[int, int, int]]] = [[] for _ in range(p["writers"])]
        for block, src in schedule:  # a block always goes to one writer: its last write is fixed
            lanes[block % p["writers"]].append((fds[block // per_file], block % per_file * bs, src))
        _run_writers(lanes, base, bs)
        for fd in fds:
            os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)

    def check() -> tuple[str, bool]:
        """Read a spread of blocks back through fresh descriptors."""
        rfds = [os.open(path, os.O_RDONLY) for path in ws_paths(root, p)]
        try:
            return _ws_check(rfds, dict(schedule), data, p)
        finally:
            for fd in rfds:
                os.close(fd)

    return check


def _run_writers(lanes: list[list[tuple[int, int, int]]], base: memoryview, bs: int) -> None:
    """Run one thread per lane of (fd, file offset, base offset) writes; re-raise a failure."""
    errors: list[BaseException] = []

    def writer(lane: list[tuple[int, int, int]]) -> None:
        """Do one lane's writes in order."""
        try:
            for fd, off, src in lane:
                write_all(fd, base[src : src + bs], off)
        except BaseException as exc:  # noqa: BLE001 -- reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(lane,)) for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _ws_check(fds: list[int], last: dict[int, int], base: bytes, p: Params) -> tuple[str, bool]:
    """Read back a spread of blocks and compare them with their last write of the round
    (``base`` as bytes: a memoryview compares element by element, 0.2 ms a block)."""
    bs, per_file = p["block_bytes"], p["file_bytes"] // p["block_bytes"]
    blocks, h, ok = len(fds) * per_file, hashlib.sha256(), True
    ok = all(os.fstat(fd).st_size == p["file_bytes"] for fd in fds)
    for block in range(0, blocks, max(1, blocks // WS_SAMPLES)):
        got = os.pread(fds[block // per_file], bs, block % per_file * bs)
        h.update(got)
        ok = ok and block in last and got == base[last[block] : last[block] + bs]
    return h.hexdigest(), ok


def build_working_set(dest: Path, seed: int, p: Params) -> None:
    """The working-set files, sparse, at their full size."""
    (dest / "ws").mkdir()
    for i in range(p["files"]):
        with open(dest / "ws" / f"file-{i}.bin", "wb") as f:
            f.truncate(p["file_bytes"])


def evolve_working_set(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Each block holds its last write (a slice of the seeded base buffer); untouched are zero.
    The files are hashed on threads, as many at once as the process has CPUs (each update is a
    whole block, which hashlib hashes without the GIL): ws1024-w1's 1 GiB took 1.2 s on one."""
    from concurrent.futures import ThreadPoolExecutor  # here: the payload never models (enum, re)

    if not rounds:
        return
    last: dict[int, int] = {}
    for k in range(1, rounds + 1):
        last.update(ws_schedule(seed, k, p))
    base = memoryview(ws_base(seed, p))
    bs, per_file = p["block_bytes"], p["file_bytes"] // p["block_bytes"]
    zero = bytes(bs)

    def digest(i: int) -> str:
        h = hashlib.sha256()
        for block in range(i * per_file, (i + 1) * per_file):
            src = last.get(block)
            h.update(zero if src is None else base[src : src + bs])
        return h.hexdigest()

    with ThreadPoolExecutor(max(1, min(len(os.sched_getaffinity(0)), p["files"]))) as pool:
        for i, sha in enumerate(pool.map(digest, range(p["files"]))):
            sources = [last.get(b, -1) for b in range(i * per_file, (i + 1) * per_file)]
            spec = (seed, base_label(p), WS_BASE + WS_BLOCK)
            s.put_blocks(f"ws/file-{i}.bin", Blocks(bs, spec, sources, sha))


def declare(number: int, ws_mib: int, writers: int) -> Declaration:
    """The working-set workload of ``ws_mib`` MiB with ``writers`` writer threads."""
    return Declaration(
        number, f"ws{ws_mib}-w{writers}", "resource", "resource",
        f"logical 1 GiB over 4 files, working set {ws_mib} MiB, "
        f"{writers} writer{'s' * (writers > 1)}",
        {"logical_bytes": scaled_bytes(GiB), "files": 4,
         "working_set_bytes": scaled_bytes(ws_mib * MiB),
         "file_bytes": scaled_bytes(ws_mib * MiB // 4), "writers": writers,
         "block_bytes": io_unit(WS_BLOCK, "file_bytes")},
        working_set, build_working_set, evolve_working_set,
        inputs=make_ahead, shape=shape, seeded_fixture=False, resources=("cpu", "fsync"),
    )  # fmt: skip


DECLARED = (declare(13, 64, 1), declare(14, 256, 1), declare(15, 1024, 1), declare(16, 256, 4))
