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
    """``sandbench host clean`` deletes what the trash holds and says how much."""
    root = ext4_images[False]
    run_one(root, 0)
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator", "host", "clean", "--work-root", str(root)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "emptied the trash: 1 removed environments' directories" in proc.stdout
    assert trash.held(root) == 0
    again = subprocess.run(
        [sys.executable, "-m", "coordinator", "host", "clean", "--work-root", str(root), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert json.loads(again.stdout)["trash_emptied"] == 0
