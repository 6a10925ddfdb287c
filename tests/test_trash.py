"""Removal deferred to the work root's trash on ext4 without a journal, deleted at once elsewhere.

Real loop-mounted ext4 images (one with a journal, one without), real environments through the
runner, the real ``sandbench host clean``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contract.records import EnvironmentSpec
from tests.conftest import REPO
from worker import ledger, trash
from worker.runner import run_environment

IMAGE_BYTES = 512 << 20


def run_one(work_root: Path, index: int) -> None:
    """One native environment of create-small in ``work_root``; it must pass."""
    spec = EnvironmentSpec(
        campaign="trash", host="local", mode="native", workload="create-small", env_index=index,
        seed=1, scale=0.05, rounds=2, work_root=str(work_root),
    )  # fmt: skip
    record = run_environment(spec)
    assert record is not None and record.outcome == "passed", record and record.detail
    assert "cleanup" not in record.provenance, record.provenance["cleanup"]


def envs(work_root: Path) -> list[str]:
    """The environments' directories left under ``envs/``."""
    return sorted(p.name for p in (work_root / ledger.ENVS_DIR).iterdir())


def test_without_a_journal_removed_environments_wait_in_the_trash(
    ext4_images: dict[bool, Path],
) -> None:
    """On ext4 without a journal each environment's directory goes whole into the trash (so no
    inode of it is freed while the campaign runs); nothing stays under envs/ or in the ledger."""
    root = ext4_images[False]
    assert trash.defers(root)
    for index in range(2):
        run_one(root, index)
    assert envs(root) == [] and ledger.entries(root) == {}
    assert trash.held(root) == 2
    kept = [p for p in (root / trash.TRASH_DIR).iterdir() if p.is_dir()]
    assert all((p / "workspace").is_dir() for p in kept)  # whole, not deleted


def test_with_a_journal_removal_deletes_at_once(ext4_images: dict[bool, Path]) -> None:
    """Where deletions do not slow creates (ext4 with a journal) nothing is kept."""
    root = ext4_images[True]
    assert not trash.defers(root)
    run_one(root, 0)
    assert envs(root) == [] and trash.held(root) == 0
    assert not (root / trash.TRASH_DIR).exists()


def test_the_trash_is_emptied_past_its_budget(ext4_images: dict[bool, Path]) -> None:
    """Once the free space fell by more than the budget's share of what was free when the trash
    started, the next removal empties it: a full disk is never the trash's doing."""
    root = ext4_images[False]
    run_one(root, 0)
    assert trash.held(root) == 1 and not trash.over_budget(root)
    start = json.loads((root / trash.TRASH_DIR / trash.SINCE_FILE).read_text())["bytes"]
    filler = root / "filler"
    with open(filler, "wb") as f:  # real blocks, not a hole
        chunk = b"\1" * (1 << 20)
        f.writelines(chunk for _ in range(int(trash.BUDGET_SHARE * start) // len(chunk) + 8))
        f.flush()
        os.fsync(f.fileno())
    assert trash.over_budget(root)
    run_one(root, 1)
    assert trash.held(root) == 0 and envs(root) == []
    filler.unlink()


def test_host_clean_empties_the_trash(ext4_images: dict[bool, Path]) -> None:
    """``sandbench host clean`` deletes what the trash holds, says how much, and says how long
    creates are slow after it."""
    root = ext4_images[False]
    run_one(root, 0)
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator", "host", "clean", "--work-root", str(root)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "emptied the trash: 1 removed environments' directories" in proc.stdout
    assert "slow for the next 5 min 30 s" in proc.stdout
    assert trash.held(root) == 0
    again = subprocess.run(
        [sys.executable, "-m", "coordinator", "host", "clean", "--work-root", str(root), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert json.loads(again.stdout)["trash_emptied"] == 0


def write_blocks(path: Path, size: int, byte: bytes = b"\1") -> None:
    """A file of ``size`` bytes with every block allocated (not a hole), written back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(byte * size)
        f.flush()
        os.fsync(f.fileno())


def test_large_files_are_deleted_at_once_and_the_rest_is_trashed(
    ext4_images: dict[bool, Path],
) -> None:
    """A removed environment's files with 1 MiB or more allocated are unlinked at once (one freed
    inode each, most of the space), the rest goes to the trash whole; a link to a large file
    outside is kept as a link and its target is untouched; a large hole is kept."""
    root = ext4_images[False]
    outside = root / "outside.bin"
    write_blocks(outside, 2 * trash.LARGE_FILE_BYTES, b"\7")
    env = root / ledger.ENVS_DIR / "e-large"
    write_blocks(env / "workspace" / "big.bin", 2 * trash.LARGE_FILE_BYTES)
    write_blocks(env / "workspace" / "deep" / "er" / "big.bin", trash.LARGE_FILE_BYTES)
    write_blocks(env / "workspace" / "small.txt", 4096)
    with open(env / "workspace" / "hole.bin", "wb") as f:
        f.truncate(8 * trash.LARGE_FILE_BYTES)
    (env / "workspace" / "link").symlink_to(outside)
    (env / "workspace" / "hard.bin").hardlink_to(outside)
    before = os.statvfs(root).f_bavail
    assert trash.discard(env, root) == []
    assert trash.held(root) == 1 and not env.exists()
    kept = next(p for p in (root / trash.TRASH_DIR).iterdir() if p.is_dir()) / "workspace"
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*")) == [
        "deep", "deep/er", "hole.bin", "link", "small.txt",
    ]  # fmt: skip
    assert (kept / "link").is_symlink() and (kept / "hole.bin").stat().st_size > 0
    assert outside.read_bytes() == b"\7" * (2 * trash.LARGE_FILE_BYTES)
    freed = (os.statvfs(root).f_bavail - before) * os.statvfs(root).f_frsize
    # the two large files (less the trash's own directory and note), not the hard link's target
    assert freed >= 3 * trash.LARGE_FILE_BYTES - (64 << 10), freed


@pytest.mark.parametrize("defer_large", [False, True])
def test_large_files_do_not_fill_the_trash_past_its_budget(
    defer_large: bool, ext4_images: dict[bool, Path]
) -> None:
    """An environment whose large files alone exceed the budget does not empty the trash: they
    are deleted (at once, or, left for the wait after it, before the budget is judged), so what
    the trash holds and waits to delete stays its small files."""
    root = ext4_images[False]
    run_one(root, 0)
    start = json.loads((root / trash.TRASH_DIR / trash.SINCE_FILE).read_text())["bytes"]
    env = root / ledger.ENVS_DIR / "e-budget"
    write_blocks(env / "workspace" / "large.bin", int(trash.BUDGET_SHARE * start) + (8 << 20))
    write_blocks(env / "workspace" / "small.txt", 4096)
    assert trash.over_budget(root)
    assert trash.discard(env, root, defer_large=defer_large) == []
    assert trash.held(root) == 2 and not trash.over_budget(root)
    assert not any(p.name.endswith(trash.LARGE_SUFFIX) for p in (root / trash.TRASH_DIR).iterdir())


def test_deferred_large_files_are_deleted_while_the_wait_lasts(
    ext4_images: dict[bool, Path],
) -> None:
    """With ``defer_large`` the directory is trashed whole and marked; ``delete_large_while``
    deletes its large files a file at a time while ``busy()`` holds, stops the moment it turns
    false (the mark stays, the rest waits), and a later call finishes and drops the mark."""
    root = ext4_images[False]
    env = root / ledger.ENVS_DIR / "e-deferred"
    for i in range(3):
        write_blocks(env / "workspace" / f"large-{i}.bin", trash.LARGE_FILE_BYTES)
    write_blocks(env / "workspace" / "small.txt", 4096)
    assert trash.discard(env, root, defer_large=True) == []
    (marked,) = (p for p in (root / trash.TRASH_DIR).iterdir() if p.is_dir())
    assert marked.name.endswith(trash.LARGE_SUFFIX)
    assert len(list((marked / "workspace").iterdir())) == 4  # nothing deleted yet

    def untouched() -> bool:  # busy until the first file is gone
        return len(list((marked / "workspace").iterdir())) == 4

    assert trash.delete_large_while(root, untouched) is False
    assert marked.is_dir() and len(list((marked / "workspace").iterdir())) == 3
    assert trash.delete_large_while(root, lambda: True) is True
    (kept,) = (p for p in (root / trash.TRASH_DIR).iterdir() if p.is_dir())
    assert not kept.name.endswith(trash.LARGE_SUFFIX)
    assert [p.name for p in (kept / "workspace").iterdir()] == ["small.txt"]
    assert trash.delete_large_while(root, lambda: True) is True  # nothing marked: done at once
