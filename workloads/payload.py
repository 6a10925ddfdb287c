"""The in-environment side of every workload: one JSON line protocol, the rounds, their checks.

Standard library only and one self-contained file: it is mounted read-only into containers and
VM guests and run as ``python3 -I -S payload.py --workload W --seed N --scale S --root DIR``.
The host imports it too (``workloads.payload``) for the parameters and the seeded generators, so
the host model and the payload agree byte for byte. Importing it has no side effects.
"""

# ruff: noqa: E402  (the ready line must precede every import but these two: Ready is timed to it)
import os
import sys

if __name__ == "__main__":
    sys.stdout.write('{"op": "ready"}\n')
    sys.stdout.flush()

import errno
import hashlib
import json
import math
import mmap
import stat
import struct
import subprocess
import threading
from collections.abc import Callable
from typing import Any

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
PAGE = 4 * KiB
MIN_BYTES = 4 * KiB  # --scale never shrinks a byte size below this
MAX_ROUNDS = 10  # fixtures prepare state for rounds 1..MAX_ROUNDS (delete-tree's trees)
WS_BLOCK = 64 * KiB  # write unit of the working-set workloads
WS_BASE = MiB  # seeded source buffer the working-set blocks are sliced from
GIT_DATE0 = 1704067200  # 2024-01-01T00:00:00Z, first fixture commit
GIT_IDENT = ("Sandbench Fixture", "fixture@sandbench.invalid")

# Full-scale parameters, in the design's table order (name, group, one-line summary, params).
# One workload per two lines reads better than the formatter's five:
# fmt: off
TABLE: list[tuple[str, str, str, dict[str, int]]] = [
    ("seq-write", "mechanism", "write 4 MiB sequentially in 64 KiB writes into a new file, fsync",
     {"file_bytes": 4 * MiB, "write_bytes": 64 * KiB}),
    ("sync-write", "mechanism", "write 1 MiB in 4 KiB writes, fsync after every write",
     {"total_bytes": MiB, "write_bytes": 4 * KiB}),
    ("create-small", "mechanism", "create 1,024 files x 4 KiB in 32 new directories, fsync dirs",
     {"files": 1024, "dirs": 32, "file_bytes": 4 * KiB}),
    ("read-small", "mechanism", "read and hash all 2,048 files of the fixture tree (32 x 64)",
     {"files": 2048, "dirs": 32, "file_bytes": 4 * KiB}),
    ("stat-tree", "mechanism", "lstat every entry of the 2,048-file tree 4 times",
     {"files": 2048, "dirs": 32, "file_bytes": 4 * KiB, "passes": 4}),
    ("readdir-wide", "mechanism", "list one directory of 8,192 entries 8 times",
     {"entries": 8192, "passes": 8}),
    ("read-large", "mechanism", "read a 64 MiB fixture file and verify its SHA-256",
     {"file_bytes": 64 * MiB, "read_bytes": MiB}),
    ("rename-atomic", "mechanism", "512 x (write temp 4 KiB, fsync, rename over target)",
     {"renames": 512, "file_bytes": 4 * KiB}),
    ("append-fsync", "mechanism", "append 4,096 x 256 B records to a log, fsync every 64",
     {"records": 4096, "record_bytes": 256, "fsync_every": 64}),
    ("delete-tree", "mechanism", "delete the fixture tree prepared for round k (1,024 files)",
     {"files": 1024, "dirs": 32, "file_bytes": 4 * KiB, "prepared_rounds": MAX_ROUNDS}),
    ("mmap-write", "mechanism", "dirty every page of a 16 MiB mapped file, msync",
     {"file_bytes": 16 * MiB, "page_bytes": PAGE}),
    ("copy-tree", "mechanism", "copy the 2,048-file tree into a new directory, fsync",
     {"files": 2048, "dirs": 32, "file_bytes": 4 * KiB}),
    *[(f"ws{ws}-w{w}", "resource",
       f"logical 1 GiB over 4 files, working set {ws} MiB, {w} writer{'s' * (w > 1)}",
       {"logical_bytes": GiB, "files": 4, "working_set_bytes": ws * MiB,
        "file_bytes": ws * MiB // 4, "writers": w, "block_bytes": WS_BLOCK})
      for ws, w in ((64, 1), (256, 1), (1024, 1), (256, 4))],
    ("repo-inspect", "workflow",
     "git status, log, grep, diff --stat on a 2,048-file, 200-commit repository after an edit",
     {"files": 2048, "dirs": 32, "commits": 200}),
    ("incremental-build", "workflow",
     "edit one unit of a 64-unit C project, make -j2, run the binary, check the edit shows",
     {"units": 64, "jobs": 2}),
    ("publish", "workflow",
     "new directory with 256 x 16 KiB files and a SHA-256 manifest, fsync files and dirs",
     {"files": 256, "file_bytes": 16 * KiB}),
]
# fmt: on
FULL_PARAMS = {name: params for name, _, _, params in TABLE}
SCALED_BYTES = ("file_bytes", "total_bytes", "logical_bytes", "working_set_bytes")
SCALED_COUNTS = ("files", "dirs", "entries", "renames", "records", "units", "commits")
UNIT_BYTES = ("write_bytes", "read_bytes", "block_bytes")  # I/O sizes: clamped, not scaled


class PayloadError(Exception):
    """A protocol or workspace problem the payload answers with an error line."""


# ---------------------------------------------------------------- parameters and generators


def scale_bytes(value: int, scale: float) -> int:
    """``value * scale`` rounded down to whole 4 KiB pages, never below 4 KiB."""
    return max(MIN_BYTES, int(value * scale) // PAGE * PAGE)


def params(name: str, scale: float) -> dict[str, int]:
    """The parameters of workload ``name`` at ``scale`` (names and structure kept)."""
    if name not in FULL_PARAMS:
        raise PayloadError(f"unknown workload {name!r}")
    if not 0 < scale <= 1:
        raise PayloadError(f"scale {scale!r} must be in (0, 1]")
    p = dict(FULL_PARAMS[name])
    fixed_counts = ("files",) if name.startswith("ws") else ()  # always 4 files
    for key in p:
        if key in SCALED_BYTES:
            p[key] = scale_bytes(p[key], scale)
        elif key in SCALED_COUNTS and key not in fixed_counts:
            p[key] = max(1, round(p[key] * scale))
    size = p.get("file_bytes", p.get("total_bytes", 0))
    for key in UNIT_BYTES:
        if key in p and size:
            p[key] = min(p[key], size)
    if name.startswith("ws"):
        _ws_shape(p)
    if "dirs" in p:
        p["dirs"] = min(p["dirs"], p["files"])
    return p


def _ws_shape(p: dict[str, int]) -> None:
    """Fix the working-set block size and per-file size (a whole number of blocks)."""
    per_file = p["working_set_bytes"] // p["files"]
    block = WS_BLOCK if per_file >= WS_BLOCK else PAGE
    p["block_bytes"] = block
    p["file_bytes"] = max(block, per_file // block * block)


# Inputs generated ahead of their round, outside the round clock (see ``Session.check``).
_PREPARED: dict[tuple[int, str, int], bytes] = {}


def stream(seed: int, label: str, n: int) -> bytes:
    """``n`` pseudo-random bytes determined by (seed, label) alone."""
    prepared = _PREPARED.pop((seed, label, n), None)
    if prepared is not None:
        return prepared
    return hashlib.shake_256(f"sandbench:{seed}:{label}".encode()).digest(n)


def prepare_stream(seed: int, label: str, n: int) -> None:
    """Generate ``stream(seed, label, n)`` now, so the round that needs it does not."""
    _PREPARED[(seed, label, n)] = hashlib.shake_256(f"sandbench:{seed}:{label}".encode()).digest(n)


def tree_paths(prefix: str, files: int, dirs: int) -> list[str]:
    """Relative paths of a ``files``-file tree spread over ``dirs`` directories."""
    per_dir = -(-files // dirs)
    return [f"{prefix}/d{i // per_dir:02d}/f{i % per_dir:04d}.dat" for i in range(files)]


def tree_dirs(prefix: str, files: int, dirs: int) -> list[str]:
    """The directories ``tree_paths`` uses, parents first."""
    per_dir = -(-files // dirs)
    return [prefix] + [f"{prefix}/d{i:02d}" for i in range(-(-files // per_dir))]


def round_bytes(seed: int, name: str, k: int, n: int) -> bytes:
    """The content a round ``k`` of workload ``name`` writes (``n`` bytes)."""
    return stream(seed, f"{name}:round:{k}", n)


def append_records(seed: int, k: int, p: dict[str, int]) -> bytes:
    """The records append-fsync appends in round ``k`` (fixed-size text lines)."""
    size, out = p["record_bytes"], []
    noise = stream(seed, f"append-fsync:round:{k}", p["records"] * size).hex()
    for i in range(p["records"]):
        head = f"r{k:02d} {i:05d} "
        out.append((head + noise[i * size : (i + 1) * size - len(head) - 1] + "\n").encode())
    return b"".join(out)


def mmap_stamp(seed: int, k: int, page: int) -> tuple[int, bytes]:
    """Offset within the page and the 16-byte stamp mmap-write puts into ``page`` in round k."""
    return ((k - 1) * 16) % PAGE, struct.pack("<IIQ", seed & 0xFFFFFFFF, k, page)


def ws_base(seed: int, p: dict[str, int]) -> bytes:
    """The seeded buffer every block a working-set workload writes is a slice of."""
    return stream(seed, f"ws:{p['working_set_bytes']}:{p['writers']}", WS_BASE + WS_BLOCK)


def ws_schedule(seed: int, k: int, p: dict[str, int]) -> list[tuple[int, int]]:
    """Round ``k``'s writes in order: (global block, offset into the base buffer)."""
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


def ws_last_writes(seed: int, rounds: int, p: dict[str, int]) -> dict[int, int]:
    """Global block -> base offset of its last write after ``rounds`` rounds."""
    last: dict[int, int] = {}
    for k in range(1, rounds + 1):
        last.update(ws_schedule(seed, k, p))
    return last


def edited_file(seed: int, k: int, files: int) -> int:
    """Index of the repository file repo-inspect edits in round ``k``."""
    return (seed * 131 + k * 977) % files


def edit_line(seed: int, k: int) -> bytes:
    """The line repo-inspect appends to its edited file in round ``k``."""
    return f"sandbench-edit-{seed} round {k}\n".encode()


def unit_edit(seed: int, k: int, units: int) -> tuple[int, int]:
    """The unit incremental-build edits in round ``k`` and the value it sets."""
    return (k - 1) % units, 100000 + (seed % 9973) * 10 + k


def set_unit_value(source: bytes, value: int) -> bytes:
    """The C source with its ``#define UNIT_VALUE`` line set to ``value``."""
    head, sep, tail = source.partition(b"#define UNIT_VALUE ")
    if not sep:
        raise PayloadError("unit source lacks '#define UNIT_VALUE'")
    _, nl, rest = tail.partition(b"\n")
    return head + sep + str(value).encode() + nl + rest


def manifest(entries: list[tuple[str, bytes]]) -> bytes:
    """A sha256sum-format manifest of (name, content) pairs."""
    return "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in entries).encode()


# ---------------------------------------------------------------- file system helpers


def fsync_path(path: str) -> None:
    """fsync a file or directory by path (directories where the file system allows it)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    try:
        os.fsync(fd)
    except OSError as exc:  # 9p and some FUSE file systems refuse fsync on a directory
        if not os.path.isdir(path) or exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
    """Write all of ``data`` (at ``offset`` with pwrite): short writes are continued."""
    view = memoryview(data)
    while view:
        done = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[done:]
        offset = None if offset is None else offset + done


def write_new(path: str, data: bytes, chunk: int = 0, sync: bool = True) -> None:
    """Create ``path`` (it must not exist) with ``data`` in ``chunk``-sized writes, fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view, step = memoryview(data), chunk or len(data) or 1
        for off in range(0, len(data), step):
            write_all(fd, view[off : off + step])
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path: str) -> bytes:
    """The whole content of ``path``."""
    with open(path, "rb") as f:
        return f.read()


def sha_file(path: str, chunk: int = MiB) -> str:
    """SHA-256 hex of the file at ``path``, read in ``chunk``-sized reads."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def check_manifest(base: str, manifest_path: str) -> tuple[str, bool]:
    """Hash every file a manifest lists (relative to ``base``); digest and whether all match."""
    h, ok = hashlib.sha256(), True
    for line in read_file(manifest_path).decode().splitlines():
        want, name = line.split("  ", 1)
        got = sha_file(os.path.join(base, name))
        h.update(got.encode())
        ok = ok and got == want
    return h.hexdigest(), ok


# ---------------------------------------------------------------- mechanism rounds

# A round returns (digest, ok), or a deferred check that returns them: a check that reads back
# what the round wrote runs only when the host asks for it, after the round clock stopped.
Check = Callable[[], tuple[str, bool]]
Round = Callable[[str, int, dict[str, int], int], "tuple[str, bool] | Check"]


def seq_write(root: str, seed: int, p: dict[str, int], k: int) -> Check:
    """Write a new file sequentially in fixed-size writes, fsync it and its directory."""
    data = round_bytes(seed, "seq-write", k, p["file_bytes"])
    path = os.path.join(root, "seq", f"round-{k:02d}.bin")
    write_new(path, data, p["write_bytes"])
    fsync_path(os.path.dirname(path))
    digest = hashlib.sha256(data).hexdigest()
    return lambda: (digest, sha_file(path) == digest)


def sync_write(root: str, seed: int, p: dict[str, int], k: int) -> Check:
    """Write a new file in small writes with an fsync after every write."""
    data = round_bytes(seed, "sync-write", k, p["total_bytes"])
    path, step = os.path.join(root, "sync", f"round-{k:02d}.bin"), p["write_bytes"]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for off in range(0, len(data), step):
            write_all(fd, data[off : off + step])
            os.fsync(fd)
    finally:
        os.close(fd)
    fsync_path(os.path.dirname(path))
    digest = hashlib.sha256(data).hexdigest()
    return lambda: (digest, sha_file(path) == digest)


def create_small(root: str, seed: int, p: dict[str, int], k: int) -> Check:
    """Create small files in new directories; fsync the directories."""
    paths = tree_paths(f"create/round-{k:02d}", p["files"], p["dirs"])
    data, size = round_bytes(seed, "create-small", k, p["files"] * p["file_bytes"]), p["file_bytes"]
    dirs = tree_dirs(f"create/round-{k:02d}", p["files"], p["dirs"])
    for d in dirs:
        os.mkdir(os.path.join(root, d))
    for i, rel in enumerate(paths):
        write_new(os.path.join(root, rel), data[i * size : (i + 1) * size], sync=False)
    for d in [*reversed(dirs), "create"]:
        fsync_path(os.path.join(root, d))

    def check() -> tuple[str, bool]:
        """Read the round's files back."""
        got = hashlib.sha256(b"".join(read_file(os.path.join(root, r)) for r in paths))
        return got.hexdigest(), got.hexdigest() == hashlib.sha256(data).hexdigest()

    return check


def read_small(root: str, seed: int, p: dict[str, int], k: int) -> tuple[str, bool]:
    """Read and hash every file of the fixture tree, checking the manifest."""
    return check_manifest(os.path.join(root, "tree"), os.path.join(root, "tree.sha256"))


def stat_tree(root: str, seed: int, p: dict[str, int], k: int) -> tuple[str, bool]:
    """lstat every entry of the fixture tree several times."""
    files, dirs = (
        tree_paths("tree", p["files"], p["dirs"]),
        tree_dirs("tree", p["files"], p["dirs"]),
    )
    want = set(files) | set(dirs)
    seen: dict[str, int] = {}
    for _ in range(p["passes"]):
        seen = {}
        stack = ["tree"]
        while stack:
            rel = stack.pop()
            st = os.lstat(os.path.join(root, rel))
            seen[rel] = st.st_size if not stat.S_ISDIR(st.st_mode) else -1
            if seen[rel] == -1:
                stack.extend(f"{rel}/{e.name}" for e in os.scandir(os.path.join(root, rel)))
    digest = hashlib.sha256(repr(sorted(seen.items())).encode()).hexdigest()
    sizes_ok = all(v in (-1, p["file_bytes"]) for v in seen.values())
    return digest, set(seen) == want and sizes_ok


def readdir_wide(root: str, seed: int, p: dict[str, int], k: int) -> tuple[str, bool]:
    """List one wide directory several times; every listing must be complete."""
    want = sorted(f"e{i:05d}" for i in range(p["entries"]))
    ok = True
    for _ in range(p["passes"]):
        ok = ok and sorted(os.listdir(os.path.join(root, "wide"))) == want
    return hashlib.sha256("\n".join(want).encode()).hexdigest(), ok


def read_large(root: str, seed: int, p: dict[str, int], k: int) -> tuple[str, bool]:
    """Read the large fixture file and verify its SHA-256 against the fixture's."""
    got = sha_file(os.path.join(root, "large.bin"), p["read_bytes"])
    want = read_file(os.path.join(root, "large.bin.sha256")).decode().split()[0]
    return got, got == want


def rename_atomic(root: str, seed: int, p: dict[str, int], k: int) -> Check:
    """Replace one target atomically many times: write temp, fsync, rename over it."""
    size, n = p["file_bytes"], p["renames"]
    data = round_bytes(seed, "rename-atomic", k, size * n)
    target, tmp = os.path.join(root, "atomic", "target"), os.path.join(root, "atomic", "target.tmp")
    for i in range(n):
        write_new(tmp, data[i * size : (i + 1) * size])
        os.rename(tmp, target)
    fsync_path(os.path.dirname(target))
    digest = hashlib.sha256(data[(n - 1) * size :]).hexdigest()
    return lambda: (digest, sha_file(target) == digest)


def append_fsync(root: str, seed: int, p: dict[str, int], k: int) -> Check:
    """Append fixed-size records to the log, fsync every few records and at the end."""
    data, size, every = append_records(seed, k, p), p["record_bytes"], p["fsync_every"]
    path = os.path.join(root, "log", "append.log")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        start = os.fstat(fd).st_size
        for i in range(p["records"]):
            write_all(fd, data[i * size : (i + 1) * size])
            if (i + 1) % every == 0 or i + 1 == p["records"]:
                os.fsync(fd)
    finally:
        os.close(fd)
    digest = hashlib.sha256(data).hexdigest()

    def check() -> tuple[str, bool]:
        """Read the round's records back from where they were appended."""
        with open(path, "rb") as f:
            f.seek(start)
            tail = f.read()
        return digest, start == (k - 1) * len(data) and hashlib.sha256(tail).hexdigest() == digest

    return check


def delete_tree(root: str, seed: int, p: dict[str, int], k: int) -> tuple[str, bool]:
    """Delete the tree the fixture prepared for round ``k``, fsync its parent."""
    top, removed = os.path.join(root, "del", f"round-{k:02d}"), 0
    if not os.path.isdir(top):
        raise PayloadError(f"delete-tree: {top} is missing (was round {k} already run?)")
    for here, dirs, files in os.walk(top, topdown=False):
        for name in files:
            os.unlink(os.path.join(here, name))
            removed += 1
        for name in dirs:
            os.rmdir(os.path.join(here, name))
    os.rmdir(top)
    fsync_path(os.path.join(root, "del"))
    return hashlib.sha256(f"{k}:{removed}".encode()).hexdigest(), removed == p["files"]


def mmap_write(root: str, seed: int, p: dict[str, int], k: int) -> Check:
    """Dirty every page of the mapped file with a round stamp, then msync."""
    path, pages = os.path.join(root, "mmap", "map.bin"), p["file_bytes"] // PAGE
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, p["file_bytes"]) as mm:
            for page in range(pages):
                off, stamp = mmap_stamp(seed, k, page)
                mm[page * PAGE + off : page * PAGE + off + 16] = stamp
            mm.flush()
    finally:
        os.close(fd)

    def check() -> tuple[str, bool]:
        """Read every page's stamp back through the file."""
        with open(path, "rb") as f:
            ok = all(
                os.pread(f.fileno(), 16, page * PAGE + mmap_stamp(seed, k, page)[0])
                == mmap_stamp(seed, k, page)[1]
                for page in range(pages)
            )
        return sha_file(path), ok

    return check


def copy_tree(root: str, seed: int, p: dict[str, int], k: int) -> Check:
    """Copy the fixture tree into a new directory, fsync files and directories."""
    dest = os.path.join(root, "copies", f"round-{k:02d}")
    dirs = tree_dirs("tree", p["files"], p["dirs"])
    for d in dirs:
        os.mkdir(os.path.join(dest, d[5:]) if d != "tree" else dest)
    for rel in tree_paths("tree", p["files"], p["dirs"]):
        write_new(os.path.join(dest, rel[5:]), read_file(os.path.join(root, rel)))
    for d in reversed(dirs):
        fsync_path(os.path.join(dest, d[5:]) if d != "tree" else dest)
    fsync_path(os.path.dirname(dest))
    return lambda: check_manifest(dest, os.path.join(root, "tree.sha256"))


# ---------------------------------------------------------------- resource rounds


def ws_paths(root: str, p: dict[str, int]) -> list[str]:
    """The working-set files under ``root``."""
    return [os.path.join(root, "ws", f"file-{i}.bin") for i in range(p["files"])]


def working_set(root: str, seed: int, p: dict[str, int], k: int) -> Check:
    """Write the round's logical bytes into the working set with N writer threads, fsync."""
    base = memoryview(ws_base(seed, p))
    bs, per_file = p["block_bytes"], p["file_bytes"] // p["block_bytes"]
    fds = [os.open(path, os.O_RDWR) for path in ws_paths(root, p)]
    try:
        schedule = ws_schedule(seed, k, p)
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
            return _ws_check(rfds, dict(schedule), base, p)
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
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(lane,)) for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _ws_check(
    fds: list[int], last: dict[int, int], base: memoryview, p: dict[str, int]
) -> tuple[str, bool]:
    """Read back a spread of blocks and compare them with their last write of the round."""
    bs, per_file = p["block_bytes"], p["file_bytes"] // p["block_bytes"]
    blocks, h, ok = len(fds) * per_file, hashlib.sha256(), True
    ok = all(os.fstat(fd).st_size == p["file_bytes"] for fd in fds)
    for block in range(0, blocks, max(1, blocks // WS_SAMPLES)):
        got = os.pread(fds[block // per_file], bs, block % per_file * bs)
        h.update(got)
        ok = ok and block in last and got == base[last[block] : last[block] + bs]
    return h.hexdigest(), ok


WS_SAMPLES = 64  # blocks read back per round by the in-environment check


# ---------------------------------------------------------------- workflow rounds


def repo_paths(p: dict[str, int]) -> list[str]:
    """Tracked file paths of the repo-inspect repository (relative to ``repo/``)."""
    per_dir = -(-p["files"] // p["dirs"])
    return [f"src/m{i // per_dir:02d}/f{i % per_dir:03d}.txt" for i in range(p["files"])]


def commit_subject(i: int) -> str:
    """Subject line of fixture commit number ``i`` (1-based)."""
    return f"commit {i:03d}"


# fmt: off
def tool_env(root: str) -> dict[str, str]:
    """Environment for git, make and gcc: no user or system config, fixed identity, C locale."""
    name, email = GIT_IDENT
    nowhere = os.path.join(root, ".no-home")  # never created: HOME may be unset or unwritable
    return {
        "PATH": os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin",
        "HOME": nowhere,
        "XDG_CONFIG_HOME": nowhere,
        "LC_ALL": "C",
        "TZ": "UTC",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_AUTHOR_DATE": f"@{GIT_DATE0} +0000",
        "GIT_COMMITTER_DATE": f"@{GIT_DATE0} +0000",
    }


# fmt: on


def run_tool(argv: list[str], cwd: str, root: str, ok: tuple[int, ...] = (0,), **env: str) -> str:
    """Run a tool with captured output (never our stdout); its stdout, or an error."""
    r = subprocess.run(
        argv,
        cwd=cwd,
        env={**tool_env(root), **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    if r.returncode not in ok:
        err = r.stderr.decode(errors="replace").strip()[-400:]
        raise PayloadError(f"{' '.join(argv[:4])} exited {r.returncode}: {err}")
    return r.stdout.decode(errors="replace")


# fmt: off
GIT = ["git", "-c", "safe.directory=*", "-c", "core.pager=cat", "-c", "gc.auto=0",
       "-c", "core.fsmonitor=false", "--no-pager"]
# fmt: on


def append_sync(path: str, data: bytes) -> None:
    """Append ``data`` to an existing file, fsync it and its directory."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_path(os.path.dirname(path))


def repo_inspect(root: str, seed: int, p: dict[str, int], k: int) -> tuple[str, bool]:
    """Edit one tracked file, then check git status, log, grep and diff --stat against the model."""
    repo, rels = os.path.join(root, "repo"), repo_paths(p)
    append_sync(os.path.join(repo, rels[edited_file(seed, k, p["files"])]), edit_line(seed, k))
    edited = sorted({rels[edited_file(seed, j, p["files"])] for j in range(1, k + 1)})
    status = run_tool([*GIT, "status", "--porcelain"], repo, root)
    log = run_tool([*GIT, "log", "--format=%s"], repo, root)
    grep = run_tool([*GIT, "grep", "-l", "-F", f"sandbench-edit-{seed} "], repo, root)
    stat_out = run_tool([*GIT, "diff", "--stat"], repo, root)
    n = len(edited)
    summary = f" {n} file{'s' * (n != 1)} changed, {k} insertion{'s' * (k != 1)}(+)"
    ok = status.splitlines() == [f" M {r}" for r in edited]
    ok = ok and log.splitlines() == [commit_subject(i) for i in range(p["commits"], 0, -1)]
    ok = ok and grep.splitlines() == edited and stat_out.splitlines()[-1:] == [summary]
    return hashlib.sha256((status + log + grep + stat_out).encode()).hexdigest(), ok


def unit_initial(seed: int, unit: int) -> int:
    """The value unit ``unit`` of the C project has in the fixture."""
    return 1000 + (seed % 97) * 100 + unit


def incremental_build(root: str, seed: int, p: dict[str, int], k: int) -> tuple[str, bool]:
    """Edit one translation unit, make -jN, run the binary, check it prints the new value."""
    proj = os.path.join(root, "build")
    unit, value = unit_edit(seed, k, p["units"])
    src = os.path.join(proj, "src", f"u{unit:02d}.c")
    data = set_unit_value(read_file(src), value)
    fd = os.open(src, os.O_WRONLY | os.O_TRUNC)
    try:
        write_all(fd, data)
        _newer_than(fd, os.path.join(proj, "obj", f"u{unit:02d}.o"))
        os.fsync(fd)
    finally:
        os.close(fd)
    run_tool(["make", f"-j{p['jobs']}", "-s"], proj, root, TMPDIR=os.path.join(proj, "obj"))
    for rel in (f"obj/u{unit:02d}.o", "app", "obj", "src", "."):
        fsync_path(os.path.join(proj, rel))
    out = run_tool(["./app"], proj, root)
    values = {u: unit_initial(seed, u) for u in range(p["units"])}
    for j in range(1, k + 1):
        u, v = unit_edit(seed, j, p["units"])
        values[u] = v
    want = [f"unit {u:02d} value {v}" for u, v in sorted(values.items())]
    return hashlib.sha256(out.encode()).hexdigest(), out.splitlines()[: p["units"]] == want


def _newer_than(fd: int, target: str) -> None:
    """Make the file ``fd`` strictly newer than ``target``, as make needs to see the edit.

    File times have the kernel's coarse clock granularity: an edit right after the previous
    round's build could otherwise carry the very same time as the object.
    """
    mtime, other = os.fstat(fd).st_mtime_ns, os.stat(target).st_mtime_ns
    if mtime <= other:
        os.utime(fd, ns=(other + MTIME_STEP_NS, other + MTIME_STEP_NS))


MTIME_STEP_NS = 1_000_000  # 1 ms: above every file system's time granularity we run on


def publish(root: str, seed: int, p: dict[str, int], k: int) -> Check:
    """Publish a new directory of files with a SHA-256 manifest, fsync files and directories."""
    dest = os.path.join(root, "pub", f"release-{k:02d}")
    os.mkdir(dest)
    entries = publish_entries(seed, k, p)
    for name, content in entries:
        write_new(os.path.join(dest, name), content)
    write_new(os.path.join(dest, "MANIFEST.sha256"), manifest(entries))
    fsync_path(dest)
    fsync_path(os.path.dirname(dest))
    return lambda: check_manifest(dest, os.path.join(dest, "MANIFEST.sha256"))


def publish_entries(seed: int, k: int, p: dict[str, int]) -> list[tuple[str, bytes]]:
    """The (name, content) pairs publish writes in round ``k``."""
    size, n = p["file_bytes"], p["files"]
    data = round_bytes(seed, "publish", k, size * n)
    return [(f"part-{i:03d}.bin", data[i * size : (i + 1) * size]) for i in range(n)]


# fmt: off
ROUNDS: dict[str, Round] = {
    "seq-write": seq_write, "sync-write": sync_write, "create-small": create_small,
    "read-small": read_small, "stat-tree": stat_tree, "readdir-wide": readdir_wide,
    "read-large": read_large, "rename-atomic": rename_atomic, "append-fsync": append_fsync,
    "delete-tree": delete_tree, "mmap-write": mmap_write, "copy-tree": copy_tree,
    "ws64-w1": working_set, "ws256-w1": working_set, "ws1024-w1": working_set,
    "ws256-w4": working_set, "repo-inspect": repo_inspect,
    "incremental-build": incremental_build, "publish": publish,
}
# fmt: on


# The seeded streams round k consumes, generated when the host asks to check round k-1
# (``check 0`` right after ready), so that generating bytes is never inside a round clock.
def _ws_inputs(s: int, p: dict[str, int], k: int) -> list[tuple[str, int]]:
    """The working-set workloads' source buffer (the same every round)."""
    return [(f"ws:{p['working_set_bytes']}:{p['writers']}", WS_BASE + WS_BLOCK)]


# fmt: off
INPUTS: dict[str, Callable[[int, dict[str, int], int], list[tuple[str, int]]]] = {
    "seq-write": lambda s, p, k: [(f"seq-write:round:{k}", p["file_bytes"])],
    "sync-write": lambda s, p, k: [(f"sync-write:round:{k}", p["total_bytes"])],
    "create-small": lambda s, p, k: [(f"create-small:round:{k}", p["files"] * p["file_bytes"])],
    "rename-atomic": lambda s, p, k: [
        (f"rename-atomic:round:{k}", p["file_bytes"] * p["renames"])],
    "append-fsync": lambda s, p, k: [
        (f"append-fsync:round:{k}", p["records"] * p["record_bytes"])],
    "publish": lambda s, p, k: [(f"publish:round:{k}", p["file_bytes"] * p["files"])],
    "ws64-w1": _ws_inputs, "ws256-w1": _ws_inputs, "ws1024-w1": _ws_inputs,
    "ws256-w4": _ws_inputs,
}
# fmt: on


# ---------------------------------------------------------------- protocol


def parse_args(argv: list[str]) -> tuple[str, int, float, str]:
    """``--workload W --seed N --scale S --root DIR`` (all four required)."""
    opts: dict[str, str] = {}
    it = iter(argv)
    for flag in it:
        if flag not in ("--workload", "--seed", "--scale", "--root") or flag in opts:
            raise PayloadError(f"unexpected argument {flag!r}")
        opts[flag] = next(it, "")
    missing = [f for f in ("--workload", "--seed", "--scale", "--root") if not opts.get(f)]
    if missing:
        raise PayloadError(f"missing argument(s): {' '.join(missing)}")
    try:
        seed, scale = int(opts["--seed"]), float(opts["--scale"])
    except ValueError as exc:
        raise PayloadError(f"bad --seed or --scale: {exc}") from None
    if not os.path.isdir(opts["--root"]):
        raise PayloadError(f"--root {opts['--root']!r} is not a directory")
    return opts["--workload"], seed, scale, opts["--root"]


class Session:
    """One payload run: the protocol channel, the workload and the round counter.

    ``round k`` -> work and in-environment sync -> ``done k`` (digest; ``validated`` when the
    check was immediate). ``check k`` (after the host stopped the round clock) -> the round's
    read-back check -> ``checked k`` (digest, validated), then round k+1's inputs are generated;
    ``check 0`` right after ready generates round 1's. A round may follow without a check.
    """

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.k: int | None = None  # the round being answered (None before the first)
        self.done = 0  # rounds completed
        self.pending: tuple[str, bool] | Check | None = None  # round ``done``'s result

    def send(self, message: dict[str, Any]) -> None:
        """Write one protocol line and flush it."""
        self.channel.write(json.dumps(message) + "\n")
        self.channel.flush()

    def serve(self, argv: list[str], lines: Any) -> int:
        """Answer round and exit requests until exit (0) or an error (1)."""
        try:
            name, seed, scale, root = parse_args(argv)
            p = params(name, scale)
            for line in lines:
                msg = json.loads(line) if line.strip() else {"op": "noop"}
                if msg.get("op") == "exit":
                    return 0
                if msg.get("op") == "round":
                    self.round(msg.get("k"), lambda k: ROUNDS[name](root, seed, p, k))
                elif msg.get("op") == "check":
                    self.check(msg.get("k"), lambda k: prepare_inputs(name, seed, p, k))
                elif msg.get("op") != "noop":
                    raise PayloadError(f"unknown request {line.strip()!r}")
            raise PayloadError("stdin closed before exit")
        except Exception as exc:
            self.send({"op": "error", "k": self.k, "message": f"{type(exc).__name__}: {exc}"})
            return 1

    def round(self, k: Any, work: Callable[[int], "tuple[str, bool] | Check"]) -> None:
        """Run round ``k`` if it is the next one, and answer done."""
        self.k = k
        if k != self.done + 1 or not isinstance(k, int):
            raise PayloadError(f"round {k!r} out of order: expected round {self.done + 1}")
        if k > MAX_ROUNDS:
            raise PayloadError(f"round {k} > {MAX_ROUNDS}, the rounds fixtures prepare")
        self.pending = result = work(k)
        if isinstance(result, tuple):
            self.send({"op": "done", "k": k, "digest": result[0], "validated": bool(result[1])})
        else:  # the read-back check waits for ``check k``
            self.send({"op": "done", "k": k, "digest": None, "validated": None})
        self.done = k

    def check(self, k: Any, prepare: Callable[[int], None]) -> None:
        """Check round ``k`` (the last one done; 0: none yet), then prepare round k+1's inputs."""
        self.k = k
        if k != self.done or not isinstance(k, int):
            raise PayloadError(f"check of round {k!r}: the last round done is {self.done}")
        pending = self.pending
        result = pending if pending is None or isinstance(pending, tuple) else pending()
        digest, ok = result if result is not None else (None, k == 0)
        self.pending = None
        if k < MAX_ROUNDS:
            prepare(k + 1)
        self.send({"op": "checked", "k": k, "digest": digest, "validated": bool(ok)})


def prepare_inputs(name: str, seed: int, p: dict[str, int], k: int) -> None:
    """Generate the seeded streams round ``k`` of ``name`` will consume (dropping stale ones)."""
    _PREPARED.clear()
    inputs = INPUTS.get(name)
    for label, n in inputs(seed, p, k) if inputs is not None else []:
        prepare_stream(seed, label, n)


def main() -> int:
    """Run the protocol on stdin/stdout; anything else written to fd 1 goes to stderr."""
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return Session(channel).serve(sys.argv[1:], sys.stdin)


if __name__ == "__main__":
    sys.exit(main())
