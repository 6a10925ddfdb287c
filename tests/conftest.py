"""Shared test fixtures and the skip policy: a missing capability skips locally, fails in CI."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.records import EnvironmentSpec

IN_CI = bool(os.environ.get("CI"))
REPO = Path(__file__).resolve().parents[1]


def require(ok: bool, capability: str) -> None:
    """Skip with a reason naming ``capability`` when it is missing; in CI, fail instead."""
    if ok:
        return
    message = f"missing capability: {capability}"
    if IN_CI:
        pytest.fail(f"{message} (CI must run this test; the set-up should have provided it)")
    pytest.skip(message)


def require_binary(name: str) -> str:
    """Path of binary ``name``, or a reasoned skip (failure in CI)."""
    sbin = Path("/usr/sbin") / name
    path = shutil.which(name) or (str(sbin) if sbin.exists() else None)
    require(path is not None, f"binary '{name}' (install it with ops/setup.sh)")
    assert path is not None
    return path


@pytest.fixture
def work_root(tmp_path: Path) -> Iterator[Path]:
    """A private work root for environments of one test."""
    root = tmp_path / "work"
    root.mkdir()
    return root


@pytest.fixture(scope="session")
def modes_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One work root for every mode's all-workloads test (fixtures built once per session)."""
    root = tmp_path_factory.getbasetemp() / "modes-work"
    root.mkdir(exist_ok=True)
    return root


def files_of(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and directory (None) under ``root``, by path: a refused command
    must leave this unchanged."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


def mode_spec(mode: str, workload: str, work_root: Path, /, **overrides: object) -> EnvironmentSpec:
    """An environment of ``workload`` in ``mode`` at the mode tests' scale (0.02, 3 rounds),
    campaign ``t-<mode>``; ``overrides`` replace any field."""
    fields: dict[str, object] = {
        "campaign": f"t-{mode}", "host": "local", "mode": mode, "workload": workload,
        "env_index": 0, "seed": 7, "scale": 0.02, "rounds": 3, "limit_s": 90.0,
        "work_root": str(work_root),
    }  # fmt: skip
    fields.update(overrides)
    return EnvironmentSpec(**fields)  # type: ignore[arg-type]


@pytest.fixture
def ext4_images(tmp_path: Path) -> Iterator[dict[bool, Path]]:
    """Two loop-mounted 512 MiB ext4 images: with a journal (True) and without one (False)."""
    require(os.geteuid() == 0, "root (loop mounts)")
    mkfs = require_binary("mkfs.ext4")
    mounts: dict[bool, Path] = {}
    try:
        for journal in (True, False):
            image, mount = tmp_path / f"{journal}.img", tmp_path / f"journal-{journal}"
            with open(image, "wb") as f:
                f.truncate(512 << 20)
            feature = "has_journal" if journal else "^has_journal"
            subprocess.run([mkfs, "-q", "-F", "-O", feature, str(image)], check=True,
                           capture_output=True)  # fmt: skip
            mount.mkdir()
            subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
            mounts[journal] = mount
        yield mounts
    finally:
        for mount in mounts.values():
            subprocess.run(["umount", str(mount)], check=True)
