"""The host oracle reports every mismatch by path: missing, extra, size, hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads import fixtures, oracle
from workloads.drive import drive
from workloads.oracle import Model
from workloads.registry import get_workload

SEED = 5
SCALE = 0.02


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The publish fixture, in a cache private to this module."""
    return fixtures.ensure_fixture("publish", SEED, SCALE, tmp_path_factory.mktemp("fixtures"))


@pytest.fixture(scope="module")
def final_state(fixture: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A publish workspace after 3 native rounds (copied per test)."""
    ws = tmp_path_factory.mktemp("final") / "ws"
    fixtures.copy_fixture(fixture, ws)
    assert drive("publish", SEED, SCALE, ws, [1, 2, 3]).ok
    return ws


@pytest.fixture
def state(final_state: Path, tmp_path: Path) -> Path:
    """A private copy of the final state."""
    fixtures.copy_fixture(final_state, tmp_path / "copy")
    return tmp_path / "copy"


@pytest.fixture
def model(fixture: Path) -> Model:
    """The publish model after 3 rounds."""
    return get_workload("publish").model(SEED, SCALE, 3, fixture=fixture)


def test_clean_state_matches(state: Path, model: Model) -> None:
    """An untouched final state has no mismatch."""
    assert oracle.compare(state, model) == []


def test_flipped_byte(state: Path, model: Model) -> None:
    """One flipped byte is a hash mismatch naming the file."""
    path = state / "pub/release-02/part-000.bin"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    [line] = oracle.compare(state, model)
    assert line.startswith("hash: pub/release-02/part-000.bin ")


def test_deleted_file(state: Path, model: Model) -> None:
    """A deleted file is reported missing by path."""
    (state / "pub/release-03/MANIFEST.sha256").unlink()
    assert oracle.compare(state, model) == ["missing: pub/release-03/MANIFEST.sha256"]


def test_stray_file_and_dir(state: Path, model: Model) -> None:
    """A stray file and a stray directory are reported extra by path."""
    (state / "pub/release-01/stray.txt").write_text("x")
    (state / "pub/junk").mkdir()
    assert oracle.compare(state, model) == ["extra: pub/release-01/stray.txt", "extra: pub/junk/"]


def test_truncated_file(state: Path, model: Model) -> None:
    """A truncated file is a size mismatch with both sizes."""
    path = state / "pub/release-01/part-000.bin"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:10])
    assert oracle.compare(state, model) == [
        f"size: pub/release-01/part-000.bin expected {size} got 10"
    ]


def test_missing_directory(state: Path, model: Model) -> None:
    """A missing published directory is reported with every file in it and the directory."""
    import shutil

    shutil.rmtree(state / "pub/release-02")
    out = oracle.compare(state, model)
    assert "missing: pub/release-02/" in out
    assert "missing: pub/release-02/MANIFEST.sha256" in out


def test_ignore_globs(tmp_path: Path) -> None:
    """Paths matching the model's ignore globs are neither required nor extra."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a/index").write_text("stat data")
    (tmp_path / "a/kept").write_text("kept")
    files = oracle.scan(tmp_path, ("a/index",))
    assert set(files) == {"a/kept"}
    m = Model(files, ("a/index", "a/gone"), frozenset({"a"}))
    assert oracle.compare(tmp_path, m) == []


def test_symlink_state(tmp_path: Path) -> None:
    """A symlink is scanned by its target string, not followed."""
    (tmp_path / "link").symlink_to("nowhere")
    assert oracle.scan(tmp_path)["link"].size == len("nowhere")
