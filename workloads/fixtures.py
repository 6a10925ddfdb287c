"""Fixtures: built once per (workload, seed, scale) into a cache, copied into every workspace."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from contract.environ import setting
from contract.errors import WorkloadError
from contract.paths import DEFAULT_WORK_ROOT
from workloads import catalog, oracle
from workloads.kit import Declaration, Params, PayloadError

# Bump when a fixture builder changes, so a host's default cache never serves stale fixtures.
FIXTURE_VERSION = 1
DEFAULT_CACHE = DEFAULT_WORK_ROOT / "fixtures" / f"v{FIXTURE_VERSION}"
CACHE_ENV = "SANDBENCH_FIXTURE_CACHE"
FICLONE = 0x40049409  # linux/fs.h _IOW(0x94, 9, int): clone a whole file's extents
REFLINK, PLAIN_COPY = "reflink", "copy"
_CLONES: dict[int, bool] = {}  # st_dev -> whether FICLONE works there


def default_cache() -> Path:
    """The fixture cache: ``$SANDBENCH_FIXTURE_CACHE``, else ``fixtures/vN`` in the work root."""
    return Path(setting(CACHE_ENV) or DEFAULT_CACHE)


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


def reflink_works(directory: Path) -> bool:
    """Whether files in ``directory`` can be cloned (Btrfs, XFS): a copy then shares extents."""
    dev = os.stat(directory).st_dev
    if dev not in _CLONES:
        with (
            tempfile.TemporaryFile(dir=directory) as src,
            tempfile.TemporaryFile(dir=directory) as dst,
        ):
            src.write(b"\0" * 4096)
            src.flush()
            try:
                fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
                _CLONES[dev] = True
            except OSError:  # EOPNOTSUPP on ext4, tmpfs; EXDEV cannot happen in one directory
                _CLONES[dev] = False
    return _CLONES[dev]


def copy_fixture(src: Path, dest: Path, *more: Path) -> str:
    """Copy the fixture tree ``src`` to the new path ``dest`` (and to each of ``more``, all at
    once: a ``cp`` each, on as many CPUs); how (``reflink`` or ``copy``).

    A reflink copy is still a fresh workspace: the fixture never changes, and a write to the
    workspace unshares only the extents it touches. Where the file system cannot clone, ``cp``
    copies the bytes (``--reflink=auto``). Symlinks, modes, times and holes are kept.
    """
    targets = (dest, *more)
    for path in targets:
        if path.exists():
            raise WorkloadError(f"copy_fixture: {path} exists; give a fresh workspace path")
        path.parent.mkdir(parents=True, exist_ok=True)
    argv = ["cp", "-a", "--reflink=auto", "--sparse=always", "--", str(src)]
    errors, copies = [], []
    try:
        for path in targets:  # appended one by one: a failed start still kills those before
            copies.append(subprocess.Popen([*argv, str(path)], stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE, text=True))  # fmt: skip
        for path, copy in zip(targets, copies, strict=True):
            err = copy.communicate()[1]
            if copy.returncode != 0:
                errors.append(f"copy_fixture {src} -> {path} failed: {err.strip()}")
    finally:
        for copy in copies:  # interrupted: no copy outlives the call
            if copy.poll() is None:
                copy.kill()
                copy.wait()
    if errors:
        raise WorkloadError(errors[0])
    same_fs = os.stat(src).st_dev == os.stat(dest.parent).st_dev
    return REFLINK if same_fs and reflink_works(dest.parent) else PLAIN_COPY


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
