"""The oracle's and the staged snapshot's hashes with large files hashed in parallel: the same
SHA-256 as ``sha256sum`` gives, and a changed byte in any file still seen; the
staged original's hole-aware digest of sparse files."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from worker.snapshot import (
    APART_ENTRIES,
    fixture_snapshot,
    snapshot,
    snapshot_after,
    snapshot_apart,
    snapshot_diff,
)
from workloads.fixtures import copy_fixture
from workloads.oracle import APART_FILES, PARALLEL_BYTES, Model, compare, scan, scan_tree


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


def sparse_tree(root: Path) -> tuple[Path, Path]:
    """A 1 GiB file that is all hole, and a 64 MiB one with data at 1 MiB and at its end."""
    empty, mixed = root / "ws" / "empty.bin", root / "ws" / "mixed.bin"
    empty.parent.mkdir(parents=True)
    with open(empty, "wb") as f:
        f.truncate(1 << 30)
    with open(mixed, "wb") as f:
        f.truncate(64 << 20)
        f.seek(1 << 20)
        f.write(os.urandom(8192))
        f.seek((64 << 20) - 4096)
        f.write(os.urandom(4096))
    (root / "small.txt").write_bytes(b"dense")
    return empty, mixed


def read_bytes_so_far(who: str = "self") -> int:
    """What this process (``who``: or this thread, ``thread-self``) has read through read(2)
    and its kin (``rchar``)."""
    io_text = Path(f"/proc/{who}/io").read_text()
    return int(next(line.split()[1] for line in io_text.splitlines() if line.startswith("rchar")))


def test_a_sparse_original_is_hashed_by_its_data_and_a_change_is_still_seen(
    tmp_path: Path,
) -> None:
    """With ``holes`` (the staged original's check), sparse files get the hole-aware digest and
    their holes are not read; the check after (``like``) takes the same kind of digest, reports
    nothing for an untouched tree, and sees one byte written into a hole or into a data region,
    and a file grown by a hole."""
    empty, mixed = sparse_tree(tmp_path)
    read = read_bytes_so_far()
    before = snapshot(tmp_path, holes=True)
    assert read_bytes_so_far() - read < (1 << 20)  # the 1 GiB and 64 MiB of holes not read
    assert before["ws/empty.bin"][-1].startswith("holes:")
    assert before["ws/mixed.bin"][-1].startswith("holes:")
    assert not before["small.txt"][-1].startswith("holes:")  # dense: the content's SHA-256
    assert snapshot_diff(before, snapshot(tmp_path, like=before)) == []
    with open(empty, "r+b") as f:  # one byte into the hole
        f.seek(512 << 20)
        f.write(b"\1")
    with open(mixed, "r+b") as f:  # one byte of the data region flipped
        f.seek((1 << 20) + 100)
        byte = f.read(1)
        f.seek((1 << 20) + 100)
        f.write(bytes([byte[0] ^ 1]))
    assert snapshot_diff(before, snapshot(tmp_path, like=before)) == [
        "changed ws/empty.bin", "changed ws/mixed.bin",
    ]  # fmt: skip
    again = snapshot(tmp_path, holes=True)
    with open(mixed, "r+b") as f:
        f.truncate((64 << 20) + 4096)  # grown by a hole: same data, another size
    assert snapshot_diff(again, snapshot(tmp_path, like=again)) == ["changed ws/mixed.bin"]


def test_a_hole_aware_digest_equals_for_equal_content_and_layout(tmp_path: Path) -> None:
    """The same sparse file copied with its holes (``cp --sparse=always``) has the same
    hole-aware digest; without ``holes`` the snapshot is the content's SHA-256 as before."""
    sparse_tree(tmp_path / "a")
    subprocess.run(["cp", "-a", "--sparse=always", str(tmp_path / "a"), str(tmp_path / "b")],
                   check=True)  # fmt: skip
    a, b = snapshot(tmp_path / "a", holes=True), snapshot(tmp_path / "b", holes=True)
    assert snapshot_diff(a, b) == []
    plain = snapshot(tmp_path / "a")
    assert plain["ws/mixed.bin"][-1] == scan(tmp_path / "a")["ws/mixed.bin"].sha256


def test_a_large_trees_check_in_a_process_of_its_own_is_the_same_snapshot(
    tmp_path: Path,
) -> None:
    """The staged original's check after the run of a tree of ``APART_ENTRIES`` entries or
    more runs in a separate process (``snapshot_after``) and gives the very snapshot the
    in-process walk gives: links, permission bits, a name that is not UTF-8, the hole-aware
    digests where the snapshot before had them; and it sees a changed byte, a removed file and
    an added one."""
    sparse_tree(tmp_path)
    (tmp_path / "tools").mkdir()
    for i in range(APART_ENTRIES):
        (tmp_path / "tools" / f"f{i:04d}").write_bytes(b"x" * (i % 7))
    (tmp_path / "tools" / "f0001").chmod(0o751)
    (tmp_path / "link").symlink_to("tools/f0002")
    odd = os.fsdecode(b"odd-\xff-name")
    (tmp_path / odd).write_bytes(b"not utf-8")
    before = snapshot(tmp_path, holes=True)
    assert len(before) >= APART_ENTRIES
    assert snapshot_apart(tmp_path, before) == snapshot(tmp_path, like=before)
    assert snapshot_diff(before, snapshot_after(tmp_path, before)) == []
    (tmp_path / "tools" / "f0003").write_bytes(b"xxy")
    (tmp_path / "tools" / "f0004").unlink()
    (tmp_path / "tools" / "new").write_bytes(b"")
    with open(tmp_path / "ws" / "mixed.bin", "r+b") as f:
        f.seek(100 << 10)
        f.write(b"\1")  # into a hole
    assert snapshot_diff(before, snapshot_apart(tmp_path, before)) == [
        "missing tools/f0004", "extra tools/new", "changed tools/f0003", "changed ws/mixed.bin",
    ]  # fmt: skip


def test_a_faithful_copy_has_its_fixtures_snapshot(tmp_path: Path) -> None:
    """The staged original's state before the run is its fixture's snapshot (kept per fixture,
    ``fixture_snapshot``): a copy made as the runner makes it (``copy_fixture``) of a tree with
    sparse files, large and small files, a link, permission bits and a non-UTF-8 name has that
    very snapshot, in-process and apart; a change made to the copy shows against it."""
    fixture, copy = tmp_path / "fixture", tmp_path / "copy"
    fixture.mkdir()
    sparse_tree(fixture)
    tree(fixture)
    (fixture / "small1.txt").chmod(0o640)
    (fixture / os.fsdecode(b"odd-\xff-name")).write_bytes(b"not utf-8")
    copy_fixture(fixture, copy)
    before = fixture_snapshot(fixture)
    assert fixture_snapshot(fixture) is before  # kept: computed once
    assert any(str(entry[-1]).startswith("holes:") for entry in before.values())
    assert snapshot_diff(before, snapshot(copy, like=before)) == []
    assert snapshot_diff(before, snapshot_apart(copy, before)) == []
    (copy / "small0.txt").chmod(0o600)
    (copy / "big" / "f1.bin").unlink()
    assert snapshot_diff(before, snapshot(copy, like=before)) == [
        "missing big/f1.bin", "changed small0.txt",
    ]  # fmt: skip


def test_a_large_trees_small_files_half_hashed_apart_give_the_same_states(tmp_path: Path) -> None:
    """The oracle's walk of a tree of ``APART_FILES`` small files or more hands half of them to
    a separate process (``apart``): the very states the in-process hashes give, a name that is
    not UTF-8 and a link included, this process reading only its own half; a byte changed in the
    half hashed apart is still a mismatch."""
    for i in range(APART_FILES + 10):
        (tmp_path / f"d{i % 7}").mkdir(exist_ok=True)
        (tmp_path / f"d{i % 7}" / f"f{i:05d}").write_bytes(bytes([i % 251]) * (500 + i % 300))
    odd = os.fsdecode(b"d6/z-\xff-name")  # sorted last: in the half hashed apart
    (tmp_path / odd).write_bytes(b"not utf-8")
    (tmp_path / "link").symlink_to("d0/f00000")
    files, dirs = scan_tree(tmp_path)
    total = sum(f.size for f in files.values())
    read = read_bytes_so_far("thread-self")  # this thread's: a reaped child's reads not in it
    assert scan_tree(tmp_path, apart=True) == (files, dirs)
    assert read_bytes_so_far("thread-self") - read < 0.75 * total  # the helper read the rest
    model = Model(files=files)
    assert compare(tmp_path, model) == []
    (tmp_path / odd).write_bytes(b"not utf-9")
    got = scan_tree(tmp_path)[0][odd].sha256
    assert compare(tmp_path, model) == [
        f"hash: {odd} expected {files[odd].sha256[:16]} got {got[:16]}"
    ]
