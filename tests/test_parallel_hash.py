"""The oracle's and the staged snapshot's hashes with large files hashed in parallel: the same
SHA-256 as ``sha256sum`` gives, and a changed byte in any file still seen."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from worker.snapshot import snapshot, snapshot_diff
from workloads.oracle import PARALLEL_BYTES, scan


def tree(root: Path) -> list[Path]:
    """Three large files (hashed on threads), two small ones and a symlink; the regular files."""
    files = []
    for i in range(3):
        path = root / "big" / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(PARALLEL_BYTES + i * 4097))
        files.append(path)
    for i in range(2):
        path = root / f"small{i}.txt"
        path.write_bytes(os.urandom(100 + i))
        files.append(path)
    (root / "link").symlink_to("small0.txt")
    return files


def test_scan_matches_sha256sum(tmp_path: Path) -> None:
    """Every regular file's digest is the one ``sha256sum`` computes from its bytes."""
    files = tree(tmp_path)
    out = subprocess.run(["sha256sum", *map(str, files)], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    expected = {
        str(Path(p).relative_to(tmp_path)): d for d, p in (x.split() for x in out.splitlines())
    }
    got = scan(tmp_path)
    assert {rel: got[rel].sha256 for rel in expected} == expected
    assert all(got[rel].size == (tmp_path / rel).stat().st_size for rel in expected)
    assert set(got) == {*expected, "link"}


def test_snapshot_sees_one_changed_byte_in_a_large_file(tmp_path: Path) -> None:
    """A byte flipped in the middle of one large file is the one change the snapshot reports."""
    files = tree(tmp_path)
    before = snapshot(tmp_path)
    with open(files[1], "r+b") as f:
        f.seek(PARALLEL_BYTES // 2)
        byte = f.read(1)
        f.seek(PARALLEL_BYTES // 2)
        f.write(bytes([byte[0] ^ 1]))
    assert snapshot_diff(before, snapshot(tmp_path)) == ["changed big/f1.bin"]


def test_a_copys_snapshot_takes_its_fixtures_hashes_and_still_sees_a_bad_copy(
    tmp_path: Path,
) -> None:
    """The snapshot of a ``cp -a`` copy given its fixture's scan (as the staged runner takes
    it) equals the one that reads every byte, down to the permission bits; a copy whose bytes
    differ from the fixture's (same size) shows as changed at the check after the run, which
    reads every byte, and a file whose size differs from the fixture's is hashed from the
    copy."""
    fixture, copy = tmp_path / "fixture", tmp_path / "copy"
    files = tree(fixture)
    (fixture / "big" / "f0.bin").chmod(0o600)
    subprocess.run(["cp", "-a", "--", str(fixture), str(copy)], check=True)
    known = scan(fixture)
    assert snapshot(copy, known) == snapshot(copy)
    # a copy gone wrong: a byte differs (same size), and a file of another size
    bad = copy / files[0].relative_to(fixture)
    data = bytearray(bad.read_bytes())
    data[7] ^= 1
    bad.write_bytes(bytes(data))
    (copy / "small1.txt").write_bytes(b"shorter")
    before = snapshot(copy, known)
    assert before[str(files[0].relative_to(fixture))] != snapshot(copy)["big/f0.bin"]
    assert before["small1.txt"] == snapshot(copy)["small1.txt"]
    assert snapshot_diff(before, snapshot(copy)) == ["changed big/f0.bin"]
