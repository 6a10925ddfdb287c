"""Mechanism workloads of small writes and synchronization: each declared once, at the bottom.

Every round function's docstring says what its round clock covers; a read-back of what the
round wrote is a ``Check``, run when the host asks for it after the clock stopped.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct

from workloads.kit import (
    PAGE,
    Declaration,
    KiB,
    MiB,
    ModelState,
    Params,
    create_tree,
    empty_dirs,
    fsync_path,
    io_unit,
    predict_tree,
    put_file,
    round_bytes,
    round_bytes_ahead,
    scaled_bytes,
    scaled_count,
    sha_file,
    stream,
    write_all,
    write_new,
)

TYPE_CHECKING = False  # ``pathlib`` is not imported at run time (``workloads.kit``)
if TYPE_CHECKING:
    from pathlib import Path

    from workloads.kit import Check

# ---------------------------------------------------------------- seq-write, sync-write


def seq_write(root: str, seed: int, p: Params, k: int) -> Check:
    """Write a new file sequentially in fixed-size writes, fsync it and its directory.

    Clock: the writes and both fsyncs. After it: the file is read back and hashed.
    """
    data = round_bytes(seed, "seq-write", k, p["file_bytes"])
    path = os.path.join(root, "seq", f"round-{k:02d}.bin")
    write_new(path, data, p["write_bytes"])
    fsync_path(os.path.dirname(path))
    digest = hashlib.sha256(data).hexdigest()
    return lambda: (digest, sha_file(path) == digest)


def evolve_seq_write(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Round k leaves seq/round-k.bin."""
    for k in range(1, rounds + 1):
        s.put(f"seq/round-{k:02d}.bin", round_bytes(seed, "seq-write", k, p["file_bytes"]))


def sync_write(root: str, seed: int, p: Params, k: int) -> Check:
    """Write a new file in small writes with an fsync after every write.

    Clock: every write and its fsync, then the directory's fsync. After it: the read-back.
    """
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


def evolve_sync_write(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Round k leaves sync/round-k.bin."""
    for k in range(1, rounds + 1):
        s.put(f"sync/round-{k:02d}.bin", round_bytes(seed, "sync-write", k, p["total_bytes"]))


# ---------------------------------------------------------------- create-small


def create_small(root: str, seed: int, p: Params, k: int) -> Check:
    """Create small files in new directories; fsync the directories.

    Clock: the mkdirs, the file writes and the directories' fsyncs. After it: the read-back.
    """
    data = round_bytes(seed, "create-small", k, p["files"] * p["file_bytes"])
    return create_tree(root, f"create/round-{k:02d}", "create", data, p)


def evolve_create_small(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Round k leaves the tree create/round-k."""
    for k in range(1, rounds + 1):
        data = round_bytes(seed, "create-small", k, p["files"] * p["file_bytes"])
        predict_tree(s, f"create/round-{k:02d}", data, p)


# ---------------------------------------------------------------- rename-atomic


def rename_atomic(root: str, seed: int, p: Params, k: int) -> Check:
    """Replace one target atomically many times: write temp, fsync, rename over it.

    Clock: every write, fsync and rename, then the directory's fsync. After it: the read-back.
    """
    size, n = p["file_bytes"], p["renames"]
    data = round_bytes(seed, "rename-atomic", k, size * n)
    target, tmp = os.path.join(root, "atomic", "target"), os.path.join(root, "atomic", "target.tmp")
    for i in range(n):
        write_new(tmp, data[i * size : (i + 1) * size])
        os.rename(tmp, target)
    fsync_path(os.path.dirname(target))
    digest = hashlib.sha256(data[(n - 1) * size :]).hexdigest()
    return lambda: (digest, sha_file(target) == digest)


def build_rename_atomic(dest: Path, seed: int, p: Params) -> None:
    """The initial target file."""
    put_file(dest / "atomic" / "target", stream(seed, "rename-atomic:fixture", p["file_bytes"]))


def evolve_rename_atomic(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """The target holds the last replacement of the last round."""
    size, n = p["file_bytes"], p["renames"]
    if rounds:
        s.put("atomic/target", round_bytes(seed, "rename-atomic", rounds, size * n)[-size:])


# ---------------------------------------------------------------- append-fsync


def append_records(seed: int, k: int, p: Params) -> bytes:
    """The records append-fsync appends in round ``k`` (fixed-size text lines)."""
    size, out = p["record_bytes"], []
    noise = stream(seed, f"append-fsync:round:{k}", p["records"] * size).hex()
    for i in range(p["records"]):
        head = f"r{k:02d} {i:05d} "
        out.append((head + noise[i * size : (i + 1) * size - len(head) - 1] + "\n").encode())
    return b"".join(out)


def append_fsync(root: str, seed: int, p: Params, k: int) -> Check:
    """Append fixed-size records to the log, fsync every few records and at the end.

    Clock: the appends and their fsyncs. After it: the round's records are read back.
    """
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


def build_append_fsync(dest: Path, seed: int, p: Params) -> None:
    """An empty log."""
    put_file(dest / "log" / "append.log", b"")


def evolve_append_fsync(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """The log holds every round's records in order."""
    s.put("log/append.log", b"".join(append_records(seed, k, p) for k in range(1, rounds + 1)))


# ---------------------------------------------------------------- mmap-write


def mmap_stamp(seed: int, k: int, page: int) -> tuple[int, bytes]:
    """Offset within the page and the 16-byte stamp mmap-write puts into ``page`` in round k."""
    return ((k - 1) * 16) % PAGE, struct.pack("<IIQ", seed & 0xFFFFFFFF, k, page)


def mmap_write(root: str, seed: int, p: Params, k: int) -> Check:
    """Dirty every page of the mapped file with a round stamp, then msync.

    Clock: mapping, the stores into every page and the msync. After it: every stamp is read
    back through the file and the file is hashed.
    """
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


def build_mmap_write(dest: Path, seed: int, p: Params) -> None:
    """The seeded file to be mapped."""
    put_file(dest / "mmap" / "map.bin", stream(seed, "mmap-write", p["file_bytes"]))


def evolve_mmap_write(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Every page carries the stamps of rounds 1..R."""
    data = bytearray(s.read_fixture("mmap/map.bin"))
    for k in range(1, rounds + 1):
        for page in range(p["file_bytes"] // PAGE):
            off, stamp = mmap_stamp(seed, k, page)
            data[page * PAGE + off : page * PAGE + off + len(stamp)] = stamp
    s.put("mmap/map.bin", bytes(data))


# ---------------------------------------------------------------- the declarations

# fmt: off
DECLARED = (
    Declaration(
        1, "seq-write", "mechanism", "writes",
        "write 4 MiB sequentially in 64 KiB writes into a new file, fsync",
        {"file_bytes": scaled_bytes(4 * MiB), "write_bytes": io_unit(64 * KiB, "file_bytes")},
        seq_write, empty_dirs("seq"), evolve_seq_write, seeded_fixture=False,
        inputs=round_bytes_ahead("seq-write", lambda p: p["file_bytes"]),
        resources=("cpu", "fsync"),
    ),
    Declaration(
        2, "sync-write", "mechanism", "writes",
        "write 1 MiB in 4 KiB writes, fsync after every write",
        {"total_bytes": scaled_bytes(MiB), "write_bytes": io_unit(4 * KiB, "total_bytes")},
        sync_write, empty_dirs("sync"), evolve_sync_write, seeded_fixture=False,
        inputs=round_bytes_ahead("sync-write", lambda p: p["total_bytes"]),
        resources=("cpu", "fsync"),
    ),
    Declaration(
        3, "create-small", "mechanism", "writes",
        "create 1,024 files x 4 KiB in 32 new directories, fsync dirs",
        {"files": scaled_count(1024), "dirs": scaled_count(32, at_most="files"),
         "file_bytes": scaled_bytes(4 * KiB)},
        create_small, empty_dirs("create"), evolve_create_small, seeded_fixture=False,
        inputs=round_bytes_ahead("create-small", lambda p: p["files"] * p["file_bytes"]),
        resources=("cpu", "metadata", "fsync"),
    ),
    Declaration(
        8, "rename-atomic", "mechanism", "writes",
        "512 x (write temp 4 KiB, fsync, rename over target)",
        {"renames": scaled_count(512), "file_bytes": scaled_bytes(4 * KiB)},
        rename_atomic, build_rename_atomic, evolve_rename_atomic,
        inputs=round_bytes_ahead("rename-atomic", lambda p: p["file_bytes"] * p["renames"]),
        resources=("cpu", "metadata", "fsync"),
    ),
    Declaration(
        9, "append-fsync", "mechanism", "writes",
        "append 4,096 x 256 B records to a log, fsync every 64",
        {"records": scaled_count(4096), "record_bytes": 256, "fsync_every": 64},
        append_fsync, build_append_fsync, evolve_append_fsync, seeded_fixture=False,
        inputs=round_bytes_ahead("append-fsync", lambda p: p["records"] * p["record_bytes"]),
        resources=("cpu", "fsync"),
    ),
    Declaration(
        11, "mmap-write", "mechanism", "writes",
        "dirty every page of a 16 MiB mapped file, msync",
        {"file_bytes": scaled_bytes(16 * MiB), "page_bytes": PAGE},
        mmap_write, build_mmap_write, evolve_mmap_write,
        resources=("cpu", "fsync"),
    ),
)
# fmt: on
