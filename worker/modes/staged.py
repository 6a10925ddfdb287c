"""``staged``: overlayfs over a read-only workspace; each round's sync publishes its changes.

The payload works in the overlay's merged view; the lower layer is the original workspace,
which must stay byte-identical (the runner snapshots and compares it). The output target
starts as a copy of the fixture the workspace was copied from (prepared by the runner beside
the workspace's copy, ``fixture_copies``; not timed); each round's ``sync`` walks the
upper layer and applies that round's creations, modifications and deletions (whiteouts,
opaque directories, entries that vanished) to the output target, then makes it durable with
one ``syncfs`` of the target's file system.
The oracle checks the output target.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from contract.errors import ModeUnavailable
from worker.modes.base import EnvContext, HostInfo, Mode, Preflight
from worker.modes.native import python_version
from worker.workroot import syncfs

OVERLAY_OPTIONS = "redirect_dir=off,metacopy=off,index=off"  # the publisher reads plain layers
OPAQUE_XATTR = "trusted.overlay.opaque"
RACY_NS = 50_000_000  # an entry changed this recently may change again unseen: republish it
MNT_DETACH = 2
PREP_TIMEOUT_S = 600.0
Signature = tuple[Any, ...] | None


def _libc() -> ctypes.CDLL:
    """The C library, for mount(2) and umount2(2)."""
    return ctypes.CDLL(None, use_errno=True)


def mount_overlay(lower: Path, upper: Path, work: Path, merged: Path) -> None:
    """Mount an overlay of ``lower`` (read-only) and ``upper`` at ``merged``."""
    for path in (lower, upper, work, merged):
        if any(c in str(path) for c in ",:\\"):
            raise ModeUnavailable(f"overlay paths cannot contain ',', ':' or '\\\\': {path}")
    options = f"lowerdir={lower},upperdir={upper},workdir={work},{OVERLAY_OPTIONS}"
    if _libc().mount(b"overlay", str(merged).encode(), b"overlay", 0, options.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount overlay at {merged}: {os.strerror(code)}")


def unmount(path: Path) -> None:
    """Detach the mount at ``path`` (nothing if it is not mounted)."""
    if _libc().umount2(str(path).encode(), MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):
            raise OSError(code, f"umount {path}: {os.strerror(code)}")


class StagedMode(Mode):
    """A staged sandbox: the task sees a writable view, the original is never touched."""

    name = "staged"
    staged = True
    fixture_copies = ("stage/output",)

    def preflight(self, host: HostInfo) -> Preflight:
        """overlayfs is available and this process may mount it on the work root's filesystem."""
        if "overlay" not in Path("/proc/filesystems").read_text():
            return Preflight(False, "the kernel has no overlayfs (modprobe overlay)")
        # Probe where environments run: an upper dir on overlayfs itself (a container's root)
        # is refused while the work root, on a volume, works.
        where = host.work_root if host.work_root.is_dir() else None
        with tempfile.TemporaryDirectory(prefix="sandbench-probe-", dir=where) as tmp:
            dirs = [Path(tmp, name) for name in ("lower", "upper", "work", "merged")]
            for path in dirs:
                path.mkdir()
            try:
                mount_overlay(*dirs)
            except OSError as exc:
                return Preflight(False, f"cannot mount overlayfs here (needs root): {exc}")
            unmount(dirs[3])
        return Preflight(True, facts={"overlay": OVERLAY_OPTIONS, "python": python_version(),
                                      "kernel": os.uname().release})  # fmt: skip

    def prepare(self, env: EnvContext) -> None:
        """Overlay directories, the output target (the runner's copy of the fixture; if there
        is none, a copy of the workspace made here), the mount."""
        stage = env.env_dir / "stage"
        dirs = {name: stage / name for name in ("upper", "work", "merged", "output")}
        for name in ("upper", "work", "merged"):
            dirs[name].mkdir(parents=True)
        if not dirs["output"].exists():
            self._copy_workspace(env, dirs["output"])
        mount_overlay(env.workspace, dirs["upper"], dirs["work"], dirs["merged"])
        env.state.update(stage=dirs, published={}, mounted=True)

    def _copy_workspace(self, env: EnvContext, output: Path) -> None:
        """The output target as a copy of the workspace."""
        output.mkdir()
        copy = subprocess.run(
            ["cp", "-a", "--reflink=auto", f"{env.workspace}/.", str(output)],
            capture_output=True, text=True, timeout=PREP_TIMEOUT_S, check=False,
        )  # fmt: skip
        if copy.returncode != 0:
            raise OSError(f"copying the workspace to the output target: {copy.stderr.strip()}")

    def launcher(self, env: EnvContext) -> list[str]:
        """The payload, rooted at the overlay's merged view."""
        return env.payload_argv(str(env.state["stage"]["merged"]))

    def sync(self, env: EnvContext, round: int) -> None:
        """Publish this round's changes from the upper layer to the output target."""
        stage = env.state["stage"]
        Publisher(stage["upper"], stage["output"], env.state["published"]).publish()

    def result_root(self, env: EnvContext) -> Path:
        """The output target."""
        return Path(env.state["stage"]["output"])

    def cleanup(self, env: EnvContext) -> None:
        """Unmount the overlay (the runner removes the directories)."""
        if env.state.pop("mounted", False):
            unmount(env.state["stage"]["merged"])


class Publisher:
    """Applies an overlay upper layer's changes since the last publication to a target tree."""

    def __init__(self, upper: Path, target: Path, published: dict[str, Signature]) -> None:
        self.upper, self.target, self.published = upper, target, published
        self.seen: dict[str, Signature] = {}
        self.dirty_dirs: set[Path] = set()
        self.now_ns = time.time_ns()

    def publish(self) -> None:
        """Walk the upper layer, apply changes and deletions, fsync the touched directories."""
        self._walk("")
        for rel in sorted(self.published.keys() - self.seen.keys(), reverse=True):
            if self.published[rel] != ("whiteout",):
                self._remove(rel)
        self.published.clear()
        self.published.update(self.seen)
        if self.dirty_dirs:  # one syncfs makes every copied file and directory durable
            syncfs(self.target)

    def _walk(self, rel_dir: str) -> None:
        """Publish the entries of one upper directory (recursively)."""
        upper_dir = self.upper / rel_dir
        names = set()
        with os.scandir(upper_dir) as entries:
            for entry in entries:
                names.add(entry.name)
                self._entry(os.path.join(rel_dir, entry.name), entry.stat(follow_symlinks=False))
        if rel_dir and _is_opaque(upper_dir):
            for name in set(os.listdir(self.target / rel_dir)) - names:
                self._remove(os.path.join(rel_dir, name))  # hidden lower entries

    def _entry(self, rel: str, info: os.stat_result) -> None:
        """Publish one upper entry according to its kind."""
        if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
            self.seen[rel] = ("whiteout",)
            if self.published.get(rel) != ("whiteout",):
                self._remove(rel)
            return
        signature = self._signature(info)
        self.seen[rel] = signature
        if stat.S_ISDIR(info.st_mode):
            self._ensure_dir(rel, info)
            self._walk(rel)
        elif signature is None or self.published.get(rel) != signature:
            self._copy(rel, info)

    def _signature(self, info: os.stat_result) -> Signature:
        """What identifies an unchanged entry; None when it changed too recently to trust."""
        if self.now_ns - info.st_ctime_ns < RACY_NS and not stat.S_ISDIR(info.st_mode):
            return None
        return (info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)

    def _ensure_dir(self, rel: str, info: os.stat_result) -> None:
        """The target has a directory at ``rel`` with the upper's permissions."""
        path = self.target / rel
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            self._remove(rel)
        if not path.exists():
            path.mkdir()
            self.dirty_dirs.add(path.parent)
        os.chmod(path, stat.S_IMODE(info.st_mode))

    def _copy(self, rel: str, info: os.stat_result) -> None:
        """Copy a regular file or symlink from the upper layer to the target, durably."""
        source, path = self.upper / rel, self.target / rel
        if path.is_dir() and not path.is_symlink():
            self._remove(rel)
        if stat.S_ISLNK(info.st_mode):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            os.symlink(os.readlink(source), path)
        elif stat.S_ISREG(info.st_mode):
            if path.is_symlink():
                path.unlink()
            shutil.copyfile(source, path)
            os.chmod(path, stat.S_IMODE(info.st_mode))
        self.dirty_dirs.add(path.parent)

    def _remove(self, rel: str) -> None:
        """Delete ``rel`` from the target, whatever it is (missing is fine)."""
        path = self.target / rel
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self.dirty_dirs.add(path.parent)


def _is_opaque(path: Path) -> bool:
    """Whether overlayfs marked this upper directory opaque (it hides the lower one)."""
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False
