"""The guest kernel: Debian's linux-image-amd64 package, fetched with apt and unpacked with dpkg."""

from __future__ import annotations

import lzma
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from contract.errors import ModeUnavailable

META_PACKAGE = "linux-image-amd64"
APT_TIMEOUT_S = 600

# Modules the guest needs, in the order they must be loaded; dependencies are added first
# automatically. ext4's soft dependency on crc32c is spelled out (busybox insmod has no softdeps).
GUEST_MODULES = (
    "virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
    "virtio_mmio", "virtio_console", "virtio_blk",
    "netfs", "fscache", "9pnet", "9pnet_virtio", "9p",
    "fuse", "virtiofs",
    "crc32c_generic", "crc16", "mbcache", "jbd2", "ext4",
)  # fmt: skip
NINEP_MODULES = ("9pnet_virtio", "9p")
VIRTIOFS_MODULES = ("fuse", "virtiofs")  # the vm-virtiofs mode's workspace
# The cgroup v2 lab host (``testbed.v2host``) also runs the staged mode and docker's overlay2.
V2HOST_MODULES = ("overlay",)
# The lab hosts (``testbed.lab``): systemd over an overlay root, on a virtio network.
LAB_MODULES = ("overlay", "virtio_net")


class KernelError(ModeUnavailable):
    """The guest kernel package cannot be fetched or does not hold what the guest needs."""


@dataclass(frozen=True)
class KernelTree:
    """An unpacked kernel package: its version, vmlinuz and module directory."""

    version: str
    vmlinuz: Path
    modules_dir: Path


def _run(argv: list[str], cwd: Path | None = None) -> str:
    """Run a set-up command; on failure raise with its output so the user sees what to fix."""
    proc = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=APT_TIMEOUT_S, check=False
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise KernelError(f"`{' '.join(argv)}` failed ({proc.returncode}): {' | '.join(tail)}")
    return str(proc.stdout)


def kernel_package_name() -> str:
    """The versioned image package the meta-package depends on (apt-get update if needed)."""
    for attempt in range(2):
        out = subprocess.run(
            ["apt-cache", "depends", META_PACKAGE], capture_output=True, text=True, check=False
        ).stdout
        found = re.findall(r"Depends:\s*(linux-image-\S+-amd64)", out)
        if found:
            return str(found[0])
        if attempt == 0:
            _run(["apt-get", "update", "-q"])
    raise KernelError(
        f"apt knows no {META_PACKAGE}: check the Debian sources in /etc/apt and run apt-get update"
    )


def download_kernel(dest: Path) -> Path:
    """Fetch the kernel image package into ``dest`` with ``apt-get download``; return the .deb."""
    dest.mkdir(parents=True, exist_ok=True)
    dest.chmod(0o777)  # apt's _apt user downloads into it when it can
    package = kernel_package_name()
    _run(["apt-get", "download", "-q", package], cwd=dest)
    debs = sorted(dest.glob(f"{package}_*.deb"))
    if not debs:
        raise KernelError(f"apt-get download {package} left no .deb in {dest}")
    return debs[-1]


def unpack_kernel(deb: Path, dest: Path) -> KernelTree:
    """Unpack ``deb`` with ``dpkg -x`` into ``dest`` and locate its vmlinuz and modules."""
    _run(["dpkg", "-x", str(deb), str(dest)])
    images = sorted((dest / "boot").glob("vmlinuz-*"))
    if not images:
        raise KernelError(f"{deb.name} holds no boot/vmlinuz-*")
    version = images[-1].name.removeprefix("vmlinuz-")
    modules_dir = dest / "lib" / "modules" / version
    if not modules_dir.is_dir():
        raise KernelError(f"{deb.name} holds no lib/modules/{version}")
    return KernelTree(version=version, vmlinuz=images[-1], modules_dir=modules_dir)


def _module_name(path: Path) -> str:
    """Module name of a .ko file: its stem with dashes as underscores."""
    return path.name.split(".ko")[0].replace("-", "_")


def module_index(modules_dir: Path) -> dict[str, Path]:
    """Module name -> .ko(.xz) file of the unpacked kernel."""
    return {_module_name(p): p for p in modules_dir.rglob("*.ko*")}


def builtin_modules(modules_dir: Path) -> set[str]:
    """Names of modules compiled into the kernel (they need no insmod)."""
    listing = modules_dir / "modules.builtin"
    if not listing.exists():
        return set()
    return {_module_name(Path(line)) for line in listing.read_text().split()}


def module_bytes(path: Path) -> bytes:
    """The module's ELF bytes, decompressed when the package ships .ko.xz."""
    data = path.read_bytes()
    return lzma.decompress(data) if path.name.endswith(".xz") else data


def module_depends(data: bytes) -> list[str]:
    """The ``depends=`` list of a module's .modinfo section."""
    match = re.search(rb"(?:^|\0)depends=([^\0]*)\0", data)
    if not match or not match.group(1):
        return []
    return [name.decode().replace("-", "_") for name in match.group(1).split(b",")]


def load_order(wanted: tuple[str, ...], index: dict[str, Path], builtin: set[str]) -> list[str]:
    """Modules to insmod, dependencies first, skipping built-ins; raise if one is missing."""
    order: list[str] = []

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in builtin or name in order:
            return
        if name not in index:
            raise KernelError(f"kernel module {name} (needed by {' <- '.join(chain)}) not found")
        for dep in module_depends(module_bytes(index[name])):
            visit(dep, (*chain, dep))
        order.append(name)

    for name in wanted:
        visit(name, (name,))
    return order


def copy_modules(order: list[str], index: dict[str, Path], dest: Path) -> None:
    """Write each module of ``order`` as ``dest/<name>.ko`` (decompressed)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in order:
        (dest / f"{name}.ko").write_bytes(module_bytes(index[name]))


def copy_vmlinuz(tree: KernelTree, dest: Path) -> Path:
    """Copy the kernel image to ``dest``."""
    shutil.copyfile(tree.vmlinuz, dest)
    return dest
