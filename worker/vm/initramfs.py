"""The guest initramfs: busybox-static, the kernel modules the guest needs and sandbench's init."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from contract.errors import ModeUnavailable

INIT_SCRIPT = Path(__file__).with_name("init.sh")
V2HOST_INIT_SCRIPT = Path(__file__).with_name("v2host_init.sh")  # the cgroup v2 lab host's init
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
DIRS = ("bin", "dev", "proc", "sys", "newroot", "lib/modules", "tmp")


class InitramfsError(ModeUnavailable):
    """The initramfs cannot be built (busybox-static or cpio missing)."""


def find_static_busybox() -> Path:
    """Path of a statically linked busybox (the initramfs has no libc)."""
    for candidate in BUSYBOX_CANDIDATES:
        path = Path(candidate)
        if path.exists() and b"/lib64/ld-linux" not in path.read_bytes()[:8192]:
            return path
    raise InitramfsError("no static busybox: install busybox-static (ops/setup.sh)")


def _populate(root: Path, modules: Path, order: list[str], init: Path) -> None:
    """Lay out the initramfs tree under ``root`` with ``init`` as its /init."""
    for name in DIRS:
        (root / name).mkdir(parents=True, exist_ok=True)
    shutil.copy2(find_static_busybox(), root / "bin" / "busybox")
    (root / "bin" / "sh").symlink_to("busybox")
    shutil.copy2(init, root / "init")
    (root / "init").chmod(0o755)
    for name in order:
        shutil.copy2(modules / f"{name}.ko", root / "lib" / "modules" / f"{name}.ko")
    (root / "modules.order").write_text("\n".join(order) + "\n")


def _cpio(root: Path) -> bytes:
    """The tree as a newc cpio archive (sorted names, so the archive is reproducible)."""
    if shutil.which("cpio") is None:
        raise InitramfsError("cpio not found: install cpio (ops/setup.sh)")
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    proc = subprocess.run(
        ["cpio", "--quiet", "-o", "-H", "newc", "-R", "0:0"],
        input=("\n".join(names) + "\n").encode(),
        cwd=root,
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise InitramfsError(f"cpio failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def build_initramfs(modules: Path, order: list[str], out: Path, init: Path = INIT_SCRIPT) -> Path:
    """Build ``out`` (gzip'd cpio) from busybox, the modules of ``order`` and ``init``."""
    with tempfile.TemporaryDirectory(prefix="sandbench-initramfs-") as tmp:
        root = Path(tmp)
        _populate(root, modules, order, init)
        archive = _cpio(root)
    partial = out.with_suffix(".partial")
    with open(partial, "wb") as fh:
        fh.write(gzip.compress(archive, compresslevel=6, mtime=0))
    os.replace(partial, out)
    return out
