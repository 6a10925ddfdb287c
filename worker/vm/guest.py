"""Prepared guest artefacts (kernel, initramfs) outside the repository, and how to build them."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from contract.environ import setting
from contract.errors import ModeUnavailable
from contract.paths import sandbench_home
from worker.vm import initramfs, kernel

MANIFEST = "guest.json"
INIT_SHA_KEY = "init_sha256"
V2HOST_SHA_KEY = "v2host_init_sha256"
MODULES_KEY = "all_modules"  # every module kept in the home, in load order (other initramfs)


def vm_home() -> Path:
    """Where the prepared guest lives: ``$SANDBENCH_VM_HOME``, else ``$SANDBENCH_HOME/vm``."""
    if home := setting("SANDBENCH_VM_HOME"):
        return Path(home)
    return sandbench_home() / "vm"


@dataclass(frozen=True)
class Guest:
    """A prepared guest: kernel image, initramfs and what went into them."""

    home: Path
    kernel_version: str
    vmlinuz: Path
    initrd: Path
    modules: tuple[str, ...]
    init_sha256: str
    v2host_initrd: Path | None = None  # the cgroup v2 lab host's initramfs (testbed.v2host)
    v2host_init_sha256: str = ""
    # Every module prepared (the VM modes', the v2 host's and the lab's), decompressed in
    # ``modules_dir``, dependencies first: another initramfs loads them all.
    all_modules: tuple[str, ...] = ()
    modules_dir: Path | None = None

    def facts(self) -> dict[str, str]:
        """Provenance facts of the guest."""
        return {
            "guest_kernel": self.kernel_version,
            "initrd_sha256": sha256_file(self.initrd)[:16],
        }


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_guest(home: Path | None = None) -> Guest | None:
    """The guest in ``home``'s manifest (None without one); ``guest_problem`` checks it."""
    home = home or vm_home()
    try:
        data = json.loads((home / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return Guest(
        home=home,
        kernel_version=data["kernel_version"],
        vmlinuz=home / data["vmlinuz"],
        initrd=home / data["initrd"],
        modules=tuple(data["modules"]),
        init_sha256=data.get(INIT_SHA_KEY, ""),
        v2host_initrd=home / data["v2host_initrd"] if data.get("v2host_initrd") else None,
        v2host_init_sha256=data.get(V2HOST_SHA_KEY, ""),
        all_modules=tuple(data.get(MODULES_KEY, ())),
        modules_dir=home / data["modules_dir"] if data.get("modules_dir") else None,
    )


def guest_problem(guest: Guest | None) -> str | None:
    """Why ``guest`` cannot run the VM modes (kernel, initramfs, 9p support), or None."""
    if guest is None:
        return f"guest kernel and initramfs not prepared in {vm_home()}: run `sandbench vm prepare`"
    if not guest.vmlinuz.is_file():
        return f"guest kernel {guest.vmlinuz} is missing: run `sandbench vm prepare --force`"
    if not guest.initrd.is_file():
        return f"initramfs {guest.initrd} is missing: run `sandbench vm prepare --force`"
    missing = [m for m in kernel.NINEP_MODULES if m not in guest.modules]
    if missing:
        return f"initramfs lacks 9p modules {missing}: run `sandbench vm prepare --force`"
    if guest.init_sha256 != sha256_file(initramfs.INIT_SCRIPT):
        return "initramfs was built from an older init: run `sandbench vm prepare --force`"
    return None


def v2host_problem(guest: Guest | None) -> str | None:
    """Why ``guest`` cannot boot the cgroup v2 lab host (its own initramfs), or None."""
    problem = guest_problem(guest)
    if problem or guest is None:
        return problem
    if guest.v2host_initrd is None or not guest.v2host_initrd.is_file():
        return f"no cgroup v2 host initramfs in {guest.home}: run `sandbench vm prepare`"
    if guest.v2host_init_sha256 != sha256_file(initramfs.V2HOST_INIT_SCRIPT):
        return "the v2 host initramfs was built from an older init: run `sandbench vm prepare`"
    return None


def modules_problem(guest: Guest | None, wanted: tuple[str, ...]) -> str | None:
    """Why ``guest`` cannot build an initramfs that loads ``wanted``, or None."""
    problem = guest_problem(guest)
    if problem or guest is None:
        return problem
    missing = [m for m in wanted if m not in guest.all_modules]
    if guest.modules_dir is None or not guest.modules_dir.is_dir() or missing:
        lacking = missing or list(wanted)
        return f"the prepared guest keeps no modules {lacking}: run `sandbench vm prepare`"
    return None


def prepare_guest(home: Path | None = None, force: bool = False) -> Guest:
    """Fetch the kernel package and build the initramfs into ``home`` (idempotent)."""
    home = home or vm_home()
    current = load_guest(home)
    if (
        current is not None
        and not force
        and v2host_problem(current) is None
        and modules_problem(current, kernel.LAB_MODULES) is None
    ):
        return current
    home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kernel-", dir=home) as tmp:
        work = Path(tmp)
        tree = kernel.unpack_kernel(kernel.download_kernel(work / "deb"), work / "tree")
        index = kernel.module_index(tree.modules_dir)
        builtin = kernel.builtin_modules(tree.modules_dir)
        order = kernel.load_order(kernel.GUEST_MODULES, index, builtin)
        v2_order = kernel.load_order(kernel.GUEST_MODULES + kernel.V2HOST_MODULES, index, builtin)
        every = kernel.GUEST_MODULES + kernel.V2HOST_MODULES + kernel.LAB_MODULES
        all_order = kernel.load_order(every, index, builtin)  # a superset of the others
        modules_dir = home / f"modules-{tree.version}"
        shutil.rmtree(modules_dir, ignore_errors=True)
        kernel.copy_modules(all_order, index, modules_dir)
        vmlinuz = kernel.copy_vmlinuz(tree, home / f"vmlinuz-{tree.version}")
        initrd = initramfs.build_initramfs(modules_dir, order, home / f"initrd-{tree.version}.gz")
        v2_initrd = initramfs.build_initramfs(
            modules_dir, v2_order, home / f"initrd-v2host-{tree.version}.gz",
            init=initramfs.V2HOST_INIT_SCRIPT,
        )  # fmt: skip
    manifest = {
        "kernel_version": tree.version,
        "vmlinuz": vmlinuz.name,
        "initrd": initrd.name,
        "modules": order,
        INIT_SHA_KEY: sha256_file(initramfs.INIT_SCRIPT),
        "v2host_initrd": v2_initrd.name,
        V2HOST_SHA_KEY: sha256_file(initramfs.V2HOST_INIT_SCRIPT),
        MODULES_KEY: all_order,
        "modules_dir": modules_dir.name,
    }
    (home / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    for stale in [*home.glob("vmlinuz-*"), *home.glob("initrd-*"), *home.glob("modules-*")]:
        if stale not in (vmlinuz, initrd, v2_initrd, modules_dir):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    guest = load_guest(home)
    problem = v2host_problem(guest)
    if guest is None or problem:
        raise ModeUnavailable(f"guest preparation in {home} left no usable guest: {problem}")
    return guest


def remove_guest(home: Path) -> None:
    """Remove every prepared artefact under ``home``."""
    shutil.rmtree(home, ignore_errors=True)


def guest_dict(guest: Guest) -> dict[str, object]:
    """The guest as a JSON-friendly dict (for ``sandbench vm status``)."""
    data = asdict(guest)
    return {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}
