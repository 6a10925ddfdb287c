"""staged mode (overlayfs): every workload passes with the original intact; publication is exact."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.records import EnvironmentSpec
from worker.modes import EnvContext, HostInfo, get_mode
from worker.modes.staged import StagedMode
from worker.runner import run_environment
from worker.snapshot import snapshot, snapshot_diff
from workloads.registry import WORKLOADS

SCALE = 0.02


def test_preflight() -> None:
    """staged's preflight mounts a probe overlay here and passes."""
    preflight = get_mode("staged").preflight(HostInfo())
    assert preflight.ok, preflight.reason
    assert "overlay" in preflight.facts


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_all_workloads_pass(modes_root: Path, workload: str) -> None:
    """Each workload passes staged: rounds validated, output matches the oracle, original intact."""
    spec = EnvironmentSpec(
        campaign="c-staged", host="local", mode="staged", workload=workload, env_index=0,
        scale=SCALE, work_root=str(modes_root),
    )  # fmt: skip
    record = run_environment(spec)
    assert record is not None and record.outcome == "passed", record and record.detail
    assert record.original_intact is True
    assert record.oracle is not None and record.oracle.ok


@pytest.fixture
def staged_env(tmp_path: Path) -> Iterator[tuple[StagedMode, EnvContext]]:
    """A prepared staged mode over a small original workspace; unmounted afterwards."""
    workspace, env_dir = tmp_path / "ws", tmp_path / "env"
    (workspace / "keep" / "sub").mkdir(parents=True)
    (workspace / "gone").mkdir()
    (workspace / "gone" / "a.txt").write_text("a")
    (workspace / "keep" / "edit.txt").write_text("old")
    (workspace / "keep" / "sub" / "del.txt").write_text("del")
    (workspace / "keep" / "link").symlink_to("edit.txt")
    (workspace / "opaque").mkdir()
    (workspace / "opaque" / "hidden.txt").write_text("hidden")
    env_dir.mkdir()
    spec = EnvironmentSpec(
        campaign="c", host="h", mode="staged", workload="seq-write", env_index=0,
        work_root=str(tmp_path),
    )  # fmt: skip
    env = EnvContext(spec, workspace, env_dir, "/")
    mode = StagedMode()
    mode.prepare(env)
    try:
        yield mode, env
    finally:
        mode.cleanup(env)


def _round_one(merged: Path) -> None:
    """Creations, an edit, a deletion, a whole-directory deletion and a recreated directory."""
    (merged / "new" / "deep").mkdir(parents=True)
    (merged / "new" / "deep" / "n.txt").write_text("new")
    (merged / "keep" / "edit.txt").write_text("new content")
    (merged / "keep" / "sub" / "del.txt").unlink()
    for name in os.listdir(merged / "gone"):
        (merged / "gone" / name).unlink()
    (merged / "gone").rmdir()
    (merged / "opaque" / "hidden.txt").unlink()
    (merged / "opaque").rmdir()
    (merged / "opaque").mkdir()  # recreated: overlayfs marks it opaque
    (merged / "opaque" / "fresh.txt").write_text("fresh")


def _round_two(merged: Path) -> None:
    """Deleting what round one created, type changes, a symlink retarget, same-size rewrite."""
    (merged / "new" / "deep" / "n.txt").unlink()
    (merged / "new" / "deep").rmdir()
    (merged / "new").rmdir()
    (merged / "gone").write_text("a file where a directory was")
    (merged / "keep" / "link").unlink()
    (merged / "keep" / "link").symlink_to("sub")
    (merged / "keep" / "edit.txt").write_text("NEW CONTENT")  # same size as round one's


def test_publication_follows_every_change(staged_env: tuple[StagedMode, EnvContext]) -> None:
    """After each round's sync the output target equals the merged view; the original is intact."""
    mode, env = staged_env
    merged, original = Path(env.state["stage"]["merged"]), snapshot(env.workspace)
    for k, change in enumerate((_round_one, _round_two), start=1):
        change(merged)
        mode.sync(env, k)
        assert snapshot_diff(snapshot(merged), snapshot(mode.result_root(env))) == []
    assert snapshot_diff(original, snapshot(env.workspace)) == []
