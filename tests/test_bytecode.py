"""The payload's body is compiled once per host process, and never run from stale bytecode."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from worker.bytecode import ensure_bytecode
from workloads.drive import PAYLOAD_PYTHON

REPO = Path(__file__).resolve().parents[1]
CHECKED_HASH_FLAGS = 0b11  # a pyc's header: hash-based, check the source
CHECKED = f"checked-hash {sys.implementation.cache_tag}"


def _copy(tmp_path: Path) -> Path:
    dest = tmp_path / "workloads"
    shutil.copytree(REPO / "workloads", dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _import_kit(root: Path) -> str:
    """What the payload's interpreter sees of ``workloads.kit`` under ``root`` (as the payload
    imports it: isolated, writing no bytecode)."""
    probe = (
        "import sys; sys.dont_write_bytecode = True; sys.path.insert(0, sys.argv[1]); "
        "import workloads.kit as k; print(k.MAX_ROUNDS)"
    )
    done = subprocess.run([PAYLOAD_PYTHON, "-I", "-S", "-c", probe, str(root)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.strip()


def test_every_module_gets_a_checked_hash_pyc(tmp_path: Path) -> None:
    """Each module of the body has its pyc for the payload's interpreter, checked by hash."""
    payload_dir = _copy(tmp_path)
    assert ensure_bytecode(payload_dir) == CHECKED
    sources = sorted(p.stem for p in payload_dir.glob("*.py"))
    compiled = sorted((payload_dir / "__pycache__").glob("*.pyc"))
    assert sorted(p.name.split(".")[0] for p in compiled) == sources
    for pyc in compiled:
        flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
        assert flags == CHECKED_HASH_FLAGS, pyc.name


def test_an_edited_module_is_compiled_from_its_source(tmp_path: Path) -> None:
    """A module edited after the compile runs as edited, even with its size and modification
    time unchanged: the import compares the source's hash, not its time stamp."""
    payload_dir = _copy(tmp_path)
    assert ensure_bytecode(payload_dir) == CHECKED
    assert _import_kit(tmp_path) == "10"
    kit = payload_dir / "kit.py"
    before, text = kit.stat(), kit.read_text()
    assert "MAX_ROUNDS = 10 " in text
    kit.write_text(text.replace("MAX_ROUNDS = 10 ", "MAX_ROUNDS = 12 ", 1))
    os.utime(kit, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert kit.stat().st_size == before.st_size
    assert _import_kit(tmp_path) == "12"


def test_once_per_process_and_a_failure_is_said(tmp_path: Path) -> None:
    """The second call does not compile again; a directory whose bytecode cannot be written
    says why (the payload then compiles from source)."""
    payload_dir = _copy(tmp_path)
    assert ensure_bytecode(payload_dir) == CHECKED
    shutil.rmtree(payload_dir / "__pycache__")
    assert ensure_bytecode(payload_dir) == CHECKED
    assert not (payload_dir / "__pycache__").exists()
    blocked = tmp_path / "blocked" / "workloads"
    shutil.copytree(payload_dir, blocked, ignore=shutil.ignore_patterns("__pycache__"))
    (blocked / "__pycache__").write_text("a file where the cache directory would go\n")
    said = ensure_bytecode(blocked)
    assert said.startswith("source (compiling "), said
    assert _import_kit(blocked.parent) == "10"


def test_the_payload_runs_from_the_bytecode(tmp_path: Path) -> None:
    """After the compile, the payload's interpreter loads the body from the bytecode files."""
    payload_dir = _copy(tmp_path)
    assert ensure_bytecode(payload_dir) == CHECKED
    probe = "import sys; sys.path.insert(0, sys.argv[1]); import workloads.protocol"
    argv = [PAYLOAD_PYTHON, "-I", "-S", "-B", "-v", "-c", probe, str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    pyc = next((payload_dir / "__pycache__").glob("protocol.*.pyc"))
    assert f"code object from '{pyc}'" in done.stderr  # -v: loaded from the bytecode file
