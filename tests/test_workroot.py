"""Removal inside the work root: a tree goes whole, on every CPU, and no link is followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contract.errors import SandbenchError
from worker.workroot import SPLIT_DEPTH, remove_tree, rmtree_parallel


def outside(tmp_path: Path) -> Path:
    """A directory outside the tree, with a file and a subdirectory links below will name."""
    target = tmp_path / "outside"
    (target / "sub").mkdir(parents=True)
    (target / "keep").write_text("keep")
    (target / "sub" / "keep").write_text("keep")
    return target


def make_tree(root: Path, target: Path) -> int:
    """A tree with files and links at every depth around ``SPLIT_DEPTH``, one wide directory
    and one deep one; its number of entries."""
    count = 0
    for depth in range(SPLIT_DEPTH + 3):
        level = root.joinpath(*[f"d{i}" for i in range(depth)])
        level.mkdir(parents=True, exist_ok=True)
        (level / "file").write_bytes(b"x" * 100)
        (level / "to-dir").symlink_to(target)  # a link to a directory outside
        (level / "to-file").symlink_to(target / "keep")
        (level / "dangling").symlink_to(level / "no-such")
        count += 5
    wide = root / "d0" / "wide"
    wide.mkdir()
    for i in range(500):
        (wide / f"f{i}").write_bytes(b"")
    os.mkfifo(root / "d0" / "fifo")
    return count + 502


def test_a_tree_goes_whole_and_no_link_is_followed(tmp_path: Path) -> None:
    target = outside(tmp_path)
    root = tmp_path / "work" / "envs" / "e"
    assert make_tree(root, target) > 500
    rmtree_parallel(root)
    assert not os.path.lexists(root)
    assert (target / "keep").read_text() == "keep" and (target / "sub" / "keep").exists()


def test_a_link_in_place_of_the_tree_is_removed_not_followed(tmp_path: Path) -> None:
    target = outside(tmp_path)
    work = tmp_path / "work"
    (work / "envs").mkdir(parents=True)
    link = work / "envs" / "e"
    link.symlink_to(target)
    with pytest.raises(SandbenchError, match="not inside the work root"):
        remove_tree(link, work)  # it resolves outside
    rmtree_parallel(link)  # below the check: nothing through the link (rmtree refuses a link)
    assert (target / "keep").exists() and (target / "sub" / "keep").exists()


def test_remove_tree_stays_inside_the_work_root(tmp_path: Path) -> None:
    target = outside(tmp_path)
    with pytest.raises(SandbenchError, match="not inside the work root"):
        remove_tree(target, tmp_path / "work")
    assert (target / "keep").exists()


def test_an_unreadable_directory_is_still_removed(tmp_path: Path) -> None:
    """A directory without read permission: the final rmtree gets it (as root)."""
    root = tmp_path / "e"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_text("x")
    (root / "a").chmod(0)
    try:
        rmtree_parallel(root)
    finally:
        if root.exists():
            (root / "a").chmod(0o755)
    assert not root.exists()
