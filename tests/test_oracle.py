"""The host oracle reports every mismatch by path: missing, extra, size, hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads import fixtures, kit, oracle
from workloads.drive import drive
from workloads.oracle import Model
from workloads.registry import Models, get_workload

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


@pytest.fixture(scope="module")
def ws_final(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """ws64-w1's fixture and a workspace of it after 3 native rounds (copied per test)."""
    fixture = fixtures.ensure_fixture("ws64-w1", SEED, SCALE, tmp_path_factory.mktemp("wsfix"))
    ws = tmp_path_factory.mktemp("wsfinal") / "ws"
    fixtures.copy_fixture(fixture, ws)
    assert drive("ws64-w1", SEED, SCALE, ws, [1, 2, 3]).ok
    return fixture, ws


def test_the_working_set_is_compared_block_by_block(
    ws_final: tuple[Path, Path], tmp_path: Path
) -> None:
    """The working-set files are predicted block by block and compared byte for byte with the
    prediction (no hash of theirs computed), by the model computed here and by the one kept on
    disk beside the fixture: an untouched final state has no mismatch; one flipped byte is a
    content mismatch naming the file and its block; a file cut short is a size mismatch."""
    fixture, final = ws_final
    state = tmp_path / "copy"
    fixtures.copy_fixture(final, state)
    workload = get_workload("ws64-w1")
    computed = workload.model(SEED, SCALE, 3, fixture=fixture)
    assert sorted(computed.blocks) == [f"ws/file-{i}.bin" for i in range(4)]
    Models().model(workload, SEED, SCALE, 3, fixture)  # computed once: kept on disk
    kept = Models().model(workload, SEED, SCALE, 3, fixture)  # a new process's: read back
    assert kept.files == computed.files
    assert {rel: (b.size, b.base, b.sources, b.sha256) for rel, b in kept.blocks.items()} == {
        rel: (b.size, b.base, b.sources, b.sha256) for rel, b in computed.blocks.items()
    }
    for model in (computed, kept):
        assert oracle.compare(state, model) == []
    block = computed.blocks["ws/file-1.bin"].size
    with open(state / "ws/file-1.bin", "r+b") as f:
        f.seek(2 * block + 7)
        byte = f.read(1)
        f.seek(2 * block + 7)
        f.write(bytes([byte[0] ^ 1]))
    for model in (computed, kept):
        assert oracle.compare(state, model) == [
            f"content: ws/file-1.bin differs in the block at byte {2 * block}"
        ]
    with open(state / "ws/file-2.bin", "r+b") as f:
        f.truncate(block)
    assert oracle.compare(state, computed)[1].startswith("size: ws/file-2.bin ")


def test_a_block_predicted_as_zeros_must_be_zeros(tmp_path: Path) -> None:
    """A block the prediction leaves untouched (zeros, a hole) and a block from the seeded
    stream: equal as predicted; a byte written into the hole, or a file longer than predicted,
    differs."""
    base = (SEED, "a label", 3 * 4096)
    data = kit.stream(*base)
    path = tmp_path / "f.bin"
    with open(path, "wb") as f:
        f.truncate(4096)
        f.seek(4096)
        f.write(data[4096:8192])
    blocks = kit.Blocks(4096, base, [-1, 4096], kit.state_of(bytes(4096) + data[4096:8192]).sha256)
    model = Model({"f.bin": kit.FileState(8192, blocks.sha256)}, blocks={"f.bin": blocks})
    assert oracle.compare(tmp_path, model) == []
    assert oracle.scan(tmp_path)["f.bin"].sha256 == blocks.sha256  # the same content, hashed
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"x")
    assert oracle.compare(tmp_path, model) == ["content: f.bin differs in the block at byte 0"]
    with open(path, "wb") as f:
        f.write(bytes(4096) + data[4096:8192] + b"more")
    assert oracle.compare(tmp_path, model)[0].startswith("size: f.bin ")
