"""Calibration environments of the machine-state sentinel: fixed work, not among the workloads.

Each measures one resource a workload's time depends on (``Declaration.resources``): the CPU
(an interpreted loop), durable writes (4 KiB appends, each fsynced), file-system metadata
(small files created in new directories, the directories fsynced, as create-small does) and
page-cache reads (a fixture file read and hashed). The sentinel (``coordinator.plan.sentinel``) runs
these in native mode at the start of a campaign, every K environments and at the end, so that
the machine's own drift shows: within a campaign over its time, between two campaigns as a
ratio, per resource. Their work never scales (every parameter is a
plain int) and is the same in every campaign. They are declared like workloads, so the payload
runs them and the oracle checks them, but the catalog keeps them apart (``CALIBRATION``): they
are not in ``workloads list``, a plan cannot name them, and no result table shows them.

Standard library only: this module runs inside the environment like the workload modules.
"""

from __future__ import annotations

import hashlib
import os

from workloads.kit import (
    Declaration,
    KiB,
    MiB,
    ModelState,
    Params,
    create_tree,
    empty_dirs,
    fsync_path,
    manifest,
    predict_tree,
    put_file,
    read_file,
    round_bytes,
    round_bytes_ahead,
    sha_file,
    stream,
    write_all,
)

TYPE_CHECKING = False  # ``pathlib`` is not imported at run time (``workloads.kit``)
if TYPE_CHECKING:
    from pathlib import Path

    from workloads.kit import Check

CPU_ITERATIONS = 150_000  # about 20 ms of one core in CPython 3.11 on a 2020s lab machine
FSYNC_WRITES = 16  # each an fsync: about 20 ms on an SSD-backed ext4
FSYNC_BLOCK = 4 * KiB
META_FILES, META_DIRS, META_BLOCK = 64, 4, 4 * KiB  # about 20 ms on an SSD-backed ext4
READ_BYTES = 8 * MiB  # read from the page cache and hashed: about 20 ms
LCG_MULTIPLIER, LCG_INCREMENT, WORD = 1103515245, 12345, 0xFFFFFFFF


def cpu_checksum(k: int, iterations: int) -> int:
    """The loop of round ``k``: an integer recurrence, interpreted, nothing else."""
    x = k
    for i in range(iterations):
        x = (x * LCG_MULTIPLIER + LCG_INCREMENT + i) & WORD
    return x


def cpu_loop(root: str, seed: int, p: Params, k: int) -> tuple[str, bool]:
    """A fixed interpreted integer loop on one core; it writes nothing.

    Clock: the loop. After it: nothing to read back (the oracle checks nothing was written).
    """
    return f"{cpu_checksum(k, p['iterations']):08x}", True


def evolve_cpu_loop(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """The workspace stays as the fixture left it."""


def _fsync_bytes(seed: int, p: Params, k: int) -> bytes:
    return round_bytes(seed, "sentinel-fsync", k, p["writes"] * p["block_bytes"])


def fsync_loop(root: str, seed: int, p: Params, k: int) -> Check:
    """Append fixed 4 KiB blocks to one log, an fsync after every block.

    Clock: every write and its fsync (round 1 also the new log's directory fsync). After it:
    the round's blocks are read back.
    """
    data, step = _fsync_bytes(seed, p, k), p["block_bytes"]
    path = os.path.join(root, "sentinel", "fsync.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for off in range(0, len(data), step):
            write_all(fd, data[off : off + step])
            os.fsync(fd)
    finally:
        os.close(fd)
    if k == 1:
        fsync_path(os.path.dirname(path))

    def check() -> tuple[str, bool]:
        """The log holds every round's blocks so far, in order."""
        earlier = b"".join(_fsync_bytes(seed, p, j) for j in range(1, k))
        digest = hashlib.sha256(earlier + data).hexdigest()
        return digest, sha_file(path) == digest

    return check


def evolve_fsync_loop(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """After R rounds the log holds rounds 1..R's blocks."""
    if rounds:
        s.put(
            "sentinel/fsync.log", b"".join(_fsync_bytes(seed, p, k) for k in range(1, rounds + 1))
        )


def _meta_bytes(seed: int, p: Params, k: int) -> bytes:
    return round_bytes(seed, "sentinel-meta", k, p["files"] * p["file_bytes"])


def meta_loop(root: str, seed: int, p: Params, k: int) -> Check:
    """Create small files in new directories, fsync the directories (create-small in little).

    Clock: the mkdirs, the file writes and the directories' fsyncs. After it: the read-back.
    """
    return create_tree(root, f"sentinel/meta-{k:02d}", "sentinel", _meta_bytes(seed, p, k), p)


def evolve_meta_loop(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Round k leaves the tree sentinel/meta-k."""
    for k in range(1, rounds + 1):
        predict_tree(s, f"sentinel/meta-{k:02d}", _meta_bytes(seed, p, k), p)


def read_loop(root: str, seed: int, p: Params, k: int) -> tuple[str, bool]:
    """Read the fixture file (in the page cache since its copy) and hash it.

    Clock: reading and hashing the whole file and the comparison with its recorded digest.
    """
    got = sha_file(os.path.join(root, "sentinel", "read.bin"))
    want = read_file(os.path.join(root, "sentinel", "read.bin.sha256")).decode().split()[0]
    return got, got == want


def build_read_loop(dest: Path, seed: int, p: Params) -> None:
    """The file to read and its sha256sum line."""
    data = stream(seed, "sentinel-read", p["file_bytes"])
    put_file(dest / "sentinel" / "read.bin", data)
    put_file(dest / "sentinel" / "read.bin.sha256", manifest([("read.bin", data)]))


def evolve_read_loop(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Reading changes nothing: the fixture stays."""


DECLARED = (
    Declaration(
        number=1, name="sentinel-cpu", group="calibration", section="calibration",
        summary=f"an interpreted integer loop of {CPU_ITERATIONS:,} steps on one core",
        parameters={"iterations": CPU_ITERATIONS},
        round=cpu_loop, build=empty_dirs("sentinel"), evolve=evolve_cpu_loop,
        seeded_fixture=False, resources=("cpu",),
    ),
    Declaration(
        number=2, name="sentinel-fsync", group="calibration", section="calibration",
        summary=f"{FSYNC_WRITES} x (append 4 KiB to a log, fsync)",
        parameters={"writes": FSYNC_WRITES, "block_bytes": FSYNC_BLOCK},
        round=fsync_loop, build=empty_dirs("sentinel"), evolve=evolve_fsync_loop,
        inputs=round_bytes_ahead("sentinel-fsync", lambda p: p["writes"] * p["block_bytes"]),
        seeded_fixture=False, resources=("fsync",),
    ),
    Declaration(
        number=3, name="sentinel-meta", group="calibration", section="calibration",
        summary=f"create {META_FILES} files x 4 KiB in {META_DIRS} new directories, fsync dirs",
        parameters={"files": META_FILES, "dirs": META_DIRS, "file_bytes": META_BLOCK},
        round=meta_loop, build=empty_dirs("sentinel"), evolve=evolve_meta_loop,
        inputs=round_bytes_ahead("sentinel-meta", lambda p: p["files"] * p["file_bytes"]),
        seeded_fixture=False, resources=("metadata",),
    ),
    Declaration(
        number=4, name="sentinel-read", group="calibration", section="calibration",
        summary=f"read and hash a {READ_BYTES // MiB} MiB file from the page cache",
        parameters={"file_bytes": READ_BYTES},
        round=read_loop, build=build_read_loop, evolve=evolve_read_loop,
        resources=("read",),
    ),
)  # fmt: skip
