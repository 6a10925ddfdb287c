"""Fresh workspaces as reflink copies where the file system clones (Btrfs), else plain copies."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require, require_binary

from contract.records import EnvironmentSpec
from worker.hostinfo import host_facts
from worker.runner import run_environment
from worker.workroot import removes_serially, rmtree_parallel
from workloads.fixtures import (
    PLAIN_COPY,
    REFLINK,
    copy_fixture,
    ensure_fixture,
    reflink_works,
    tree_digest,
)

IMAGE_BYTES = 1 << 30
MIB = 1 << 20


def _loop_mount(tmp_path: Path, fstype: str) -> Iterator[Path]:
    """A fresh sparse image of ``fstype`` loop-mounted under ``tmp_path``; unmounted after."""
    require(os.geteuid() == 0, "root (loop mounts)")
    mkfs = require_binary(f"mkfs.{fstype}")
    image, mount = tmp_path / f"{fstype}.img", tmp_path / fstype
    with open(image, "wb") as f:
        f.truncate(IMAGE_BYTES)
    subprocess.run([mkfs, "-q", str(image)] if fstype != "ext4" else [mkfs, "-q", "-F", str(image)],
                   check=True, capture_output=True)  # fmt: skip
    mount.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture
def btrfs(tmp_path: Path) -> Iterator[Path]:
    """A loop-mounted Btrfs (the reference study's host file system)."""
    yield from _loop_mount(tmp_path, "btrfs")


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[Path]:
    """A loop-mounted ext4 (no reflinks)."""
    yield from _loop_mount(tmp_path, "ext4")


def _used_bytes(mount: Path) -> int:
    """Bytes in use on the file system at ``mount``, after its pending writes reach the disk."""
    os.sync()
    st = os.statvfs(mount)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_a_workspace_on_btrfs_shares_the_fixtures_extents(btrfs: Path) -> None:
    """A 64 MiB fixture copied on Btrfs costs almost no space and says it was a reflink."""
    fixture = ensure_fixture("read-large", 0, 1.0, btrfs / "fixtures")
    before = _used_bytes(btrfs)
    assert copy_fixture(fixture, btrfs / "ws") == REFLINK
    assert _used_bytes(btrfs) - before < 8 * MIB  # metadata only; a plain copy costs 64 MiB
    assert tree_digest(btrfs / "ws") == tree_digest(fixture)


def test_on_ext4_the_copy_is_plain_and_says_so(ext4: Path) -> None:
    """ext4 cannot clone: the workspace is a byte copy, reported as such."""
    assert not reflink_works(ext4)
    fixture = ensure_fixture("read-large", 0, 0.25, ext4 / "fixtures")
    before = _used_bytes(ext4)
    assert copy_fixture(fixture, ext4 / "ws") == PLAIN_COPY
    assert _used_bytes(ext4) - before >= 16 * MIB


@pytest.mark.parametrize("workload", ["read-large", "ws64-w1", "delete-tree"])
def test_environments_on_a_reflink_workspace_pass_and_leave_the_fixture_intact(
    btrfs: Path, workload: str
) -> None:
    """Writes to a cloned workspace unshare its extents only: the fixture stays as built."""
    fixtures = btrfs / "fixtures"
    fixture = ensure_fixture(workload, 0, 0.1, fixtures)
    digest = tree_digest(fixture)
    spec = EnvironmentSpec(campaign="c-reflink", host="local", mode="native", workload=workload,
                           env_index=0, scale=0.1, work_root=str(btrfs))  # fmt: skip
    record = run_environment(spec)
    assert record is not None and record.outcome == "passed", record and record.detail
    assert record.provenance["workspace_copy"] == REFLINK
    assert host_facts(btrfs, {})["workspace_copy"] == REFLINK
    assert tree_digest(fixture) == digest


def test_removal_runs_on_one_thread_on_btrfs_and_on_all_cpus_on_ext4(
    btrfs: Path, ext4: Path
) -> None:
    """``rmtree_parallel`` splits a tree over threads on ext4 but not on Btrfs, where one thread
    is faster (``SERIAL_REMOVAL``); either way the whole tree goes, a link's target kept."""
    for root, serial in ((btrfs, True), (ext4, False)):
        tree = root / "ws"
        for i in range(40):
            (tree / f"a{i % 4}" / f"b{i % 5}").mkdir(parents=True, exist_ok=True)
            (tree / f"a{i % 4}" / f"b{i % 5}" / f"f{i}").write_bytes(b"x" * i)
        (root / "kept").write_bytes(b"target")
        (tree / "a0" / "link").symlink_to(root / "kept")
        assert removes_serially(os.stat(tree).st_dev, tree) is serial
        rmtree_parallel(tree)
        assert not tree.exists() and (root / "kept").read_bytes() == b"target"
