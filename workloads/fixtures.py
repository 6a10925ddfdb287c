"""Fixtures: built once per (workload, seed, scale) into a cache, copied into every workspace."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tasks.errors import WorkloadError
from tasks.paths import DEFAULT_WORK_ROOT
from workloads import catalog, oracle
from workloads.kit import Declaration, Params, PayloadError

# Bump when a fixture builder changes, so a host's default cache never serves stale fixtures.
FIXTURE_VERSION = 1
DEFAULT_CACHE = DEFAULT_WORK_ROOT / "fixtures" / f"v{FIXTURE_VERSION}"
CACHE_ENV = "SANDBENCH_FIXTURE_CACHE"


def default_cache() -> Path:
    """The fixture cache: ``$SANDBENCH_FIXTURE_CACHE``, else ``fixtures/vN`` in the work root."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def fixture_dirname(name: str, seed: int, scale: float) -> str:
    """Cache directory name of a fixture: ``<name>-s<seed>-x<scale>``."""
    return f"{name}-s{seed}-x{float(scale)!r}"


def checked_params(workload: Declaration, scale: float) -> Params:
    """The workload's parameters at ``scale``; WorkloadError (bad input) outside (0, 1]."""
    try:
        return workload.scaled(scale)
    except PayloadError as exc:
        raise WorkloadError(f"{workload.name}: {exc}") from None


def build_fixture(workload: Declaration, dest: Path, seed: int, scale: float) -> None:
    """Create ``dest`` (which must not exist) holding the fixture for (seed, scale)."""
    p = checked_params(workload, scale)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.mkdir()
    try:
        workload.build(dest, seed, p)
    except PayloadError as exc:  # a tool the builder runs failed: this host cannot build it
        raise WorkloadError(f"{workload.name}: {exc}") from None


def ensure_fixture(name: str, seed: int, scale: float, cache_root: Path) -> Path:
    """The cached fixture, built first if absent (atomically: concurrent builders are safe)."""
    try:
        workload = catalog.declared(name)
    except PayloadError as exc:
        raise WorkloadError(str(exc)) from None
    target = cache_root / fixture_dirname(name, seed, scale)
    if target.is_dir():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".build-{target.name}-", dir=cache_root))
    try:
        build_fixture(workload, scratch / "fixture", seed, scale)
        try:
            os.rename(scratch / "fixture", target)
        except OSError:
            if not target.is_dir():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def copy_fixture(src: Path, dest: Path) -> None:
    """Copy the fixture tree ``src`` to the new path ``dest``: symlinks, modes, times, holes."""
    if dest.exists():
        raise WorkloadError(f"copy_fixture: {dest} exists; give a fresh workspace path")
    dest.parent.mkdir(parents=True, exist_ok=True)
    argv = ["cp", "-a", "--reflink=auto", "--sparse=always", "--", str(src), str(dest)]
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise WorkloadError(f"copy_fixture {src} -> {dest} failed: {r.stderr.strip()}")


def tree_digest(root: Path, ignore: Iterable[str] = ()) -> str:
    """SHA-256 over every entry's path, type, permission bits, size and content."""
    h = hashlib.sha256()
    files, _ = oracle.scan_tree(root, ignore)
    for rel, st in oracle.walk(root, ignore):
        kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "f"
        state = files.get(rel)
        content = f"{state.size}:{state.sha256}" if state else ""
        h.update(f"{rel}\0{kind}\0{stat.S_IMODE(st.st_mode):o}\0{content}\n".encode())
    return h.hexdigest()
