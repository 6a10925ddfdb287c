"""Fixtures are deterministic, cached atomically and copied faithfully."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workloads import fixtures, kit, oracle
from workloads.registry import WORKLOADS, get_workload

REPO = Path(__file__).resolve().parents[1]
PACK_NAME = re.compile(r"pack-[0-9a-f]{40}")


def build(name: str, seed: int, scale: float, dest: Path) -> tuple[str, set[str]]:
    """Build a fixture into ``dest``: its tree digest and its set of paths."""
    workload = get_workload(name)
    workload.build_fixture(dest, seed, scale)
    # git names its one pack by content: the structure is "one pack", whatever its name
    paths = {PACK_NAME.sub("pack-*", rel) for rel, _ in oracle.walk(dest, workload.ignore)}
    return fixtures.tree_digest(dest, workload.ignore), paths


def check_determinism(name: str, scale: float, tmp_path: Path) -> None:
    """Same seed: same digest; other seed: same paths and, for seeded fixtures, other content."""
    digest_a, paths_a = build(name, 1, scale, tmp_path / "a")
    digest_b, _paths_b = build(name, 1, scale, tmp_path / "b")
    digest_c, paths_c = build(name, 2, scale, tmp_path / "c")
    assert digest_a == digest_b
    assert paths_a == paths_c
    assert (digest_a != digest_c) == get_workload(name).seeded_fixture


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_fixture_deterministic_small(name: str, tmp_path: Path) -> None:
    """At scale 0.02, two builds with one seed are identical and another seed changes content."""
    check_determinism(name, 0.02, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_fixture_deterministic_full(name: str, tmp_path: Path) -> None:
    """At scale 1.0, two builds with one seed are identical and another seed changes content."""
    check_determinism(name, 1.0, tmp_path)


def test_full_scale_sizes(tmp_path: Path) -> None:
    """Scale 1.0 fixtures have the design's sizes: 2,048-file tree, 8,192 entries, 64 MiB."""
    files = oracle.scan(fixtures.ensure_fixture("read-small", 3, 1.0, tmp_path))
    assert len([f for f in files if f.startswith("tree/")]) == 2048
    assert len({f.rsplit("/", 1)[0] for f in files if f.startswith("tree/")}) == 32
    wide = fixtures.ensure_fixture("readdir-wide", 3, 1.0, tmp_path) / "wide"
    assert len(os.listdir(wide)) == 8192
    large = fixtures.ensure_fixture("read-large", 3, 1.0, tmp_path) / "large.bin"
    assert large.stat().st_size == 64 * kit.MiB


def test_scale_keeps_structure_and_minimums() -> None:
    """Scaling shrinks sizes and counts, never below 1 file or 4 KiB, keeping the keys."""
    for name, workload in WORKLOADS.items():
        small = workload.params(0.0001)
        assert small.keys() == workload.full_params.keys(), name
        assert all(v >= 1 for v in small.values()), name
        for key in ("file_bytes", "total_bytes"):
            assert small.get(key, 4096) >= 4096, name
    assert get_workload("create-small").params(0.5)["files"] == 512


def test_ensure_fixture_race(tmp_path: Path) -> None:
    """Two processes building one fixture at once leave one complete fixture and no scratch."""
    code = (
        "import sys; from pathlib import Path; from workloads.fixtures import ensure_fixture;"
        "print(ensure_fixture('repo-inspect', 4, 0.05, Path(sys.argv[1])))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO,
                         stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] and os.listdir(tmp_path) == [Path(outs[0]).name]
    digest, _ = build("repo-inspect", 4, 0.05, tmp_path / "fresh")
    assert fixtures.tree_digest(Path(outs[0]), get_workload("repo-inspect").ignore) == digest


def test_copy_fixture_faithful(tmp_path: Path) -> None:
    """A copy keeps symlinks, modes, sparse files and a valid git repository, and so does
    each further copy made at the same time (a staged mode's output target)."""
    src = tmp_path / "src"
    get_workload("repo-inspect").build_fixture(src, 1, 0.02)
    (src / "link").symlink_to("repo/.git/HEAD")
    (src / "tool.sh").write_text("#!/bin/sh\n")
    (src / "tool.sh").chmod(0o750)
    with open(src / "sparse", "wb") as f:
        f.truncate(64 << 20)
    fixtures.copy_fixture(src, tmp_path / "dest", tmp_path / "env" / "stage" / "output")
    for dest in (tmp_path / "dest", tmp_path / "env" / "stage" / "output"):
        assert fixtures.tree_digest(dest, ("repo/.git/index",)) == fixtures.tree_digest(
            src, ("repo/.git/index",)
        )
        assert os.readlink(dest / "link") == "repo/.git/HEAD"
        assert (dest / "tool.sh").stat().st_mode & 0o777 == 0o750
        assert (dest / "sparse").stat().st_blocks * 512 < 1 << 20
        fsck = subprocess.run(
            ["git", "-c", "safe.directory=*", "fsck", "--strict"], cwd=dest / "repo",
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert fsck.returncode == 0, fsck.stderr


def test_copy_fixture_says_which_copy_failed(tmp_path: Path) -> None:
    """A copy that fails (here: no such fixture) is an error naming the fixture and the
    destination with cp's own words, not a silent empty workspace."""
    with pytest.raises(fixtures.WorkloadError, match=r"missing -> .*/a failed: .*No such file"):
        fixtures.copy_fixture(tmp_path / "missing", tmp_path / "a", tmp_path / "b")


def test_copy_fixture_refuses_existing(tmp_path: Path) -> None:
    """Copying onto an existing path is refused with a message that says what to do."""
    (tmp_path / "src").mkdir()
    (tmp_path / "dest").mkdir()
    with pytest.raises(fixtures.WorkloadError, match="fresh workspace"):
        fixtures.copy_fixture(tmp_path / "src", tmp_path / "dest")


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_model_seed_changes_content_not_paths(name: str, tmp_path: Path) -> None:
    """Final-state models of two seeds share their paths; seeded content differs."""
    workload = get_workload(name)
    a, b = (
        workload.model(seed, 0.02, 3, fixture=fixtures.ensure_fixture(name, seed, 0.02, tmp_path))
        for seed in (1, 2)
    )
    assert {PACK_NAME.sub("pack-*", p) for p in a.files} == {
        PACK_NAME.sub("pack-*", p) for p in b.files
    }
    assert a.dirs == b.dirs
    assert (a.files != b.files) == (name != "readdir-wide")  # its 8,192 entries are empty
