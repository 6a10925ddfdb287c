"""Guest preparation: Debian's kernel package, module order, initramfs, job file, exit wrapper."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, require, require_binary
from worker.modes.base import HostInfo
from worker.modes.vm import VmMode, extract_image, make_image
from worker.vm import guest, kernel, qemu
from worker.vm.job import Job


@pytest.fixture(scope="module")
def kernel_tree(tmp_path_factory: pytest.TempPathFactory) -> kernel.KernelTree:
    """Debian's kernel image package, fetched with apt-get download and unpacked with dpkg -x."""
    require_binary("apt-get")
    work = tmp_path_factory.mktemp("kernel")
    deb = kernel.download_kernel(work / "deb")
    return kernel.unpack_kernel(deb, work / "tree")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> guest.Guest:
    """A guest prepared from scratch into a private directory."""
    require_binary("apt-get")
    require_binary("cpio")
    return guest.prepare_guest(tmp_path_factory.mktemp("vm-home"))


@pytest.mark.slow
def test_load_order_puts_dependencies_first(kernel_tree: kernel.KernelTree) -> None:
    """Every module the guest loads comes after the modules it depends on."""
    index = kernel.module_index(kernel_tree.modules_dir)
    builtin = kernel.builtin_modules(kernel_tree.modules_dir)
    order = kernel.load_order(kernel.GUEST_MODULES, index, builtin)
    for position, name in enumerate(order):
        for dep in kernel.module_depends(kernel.module_bytes(index[name])):
            assert dep in builtin or order.index(dep) < position, f"{dep} after {name}"
    assert {"9p", "9pnet_virtio", "virtio_console", "ext4"} <= set(order) | builtin
    assert order.index("virtio_ring") < order.index("virtio_pci")


@pytest.mark.slow
def test_missing_module_is_named(kernel_tree: kernel.KernelTree) -> None:
    """A module the package lacks is reported by name, with the chain that needs it."""
    index = kernel.module_index(kernel_tree.modules_dir)
    with pytest.raises(kernel.KernelError, match="no_such_module"):
        kernel.load_order(("no_such_module",), index, set())


@pytest.mark.slow
def test_prepare_builds_kernel_and_initramfs(prepared: guest.Guest) -> None:
    """prepare writes vmlinuz, an initramfs with busybox, init and modules, and a manifest."""
    assert prepared.vmlinuz.stat().st_size > 1 << 20
    listing = subprocess.run(
        ["cpio", "-t", "--quiet"], input=gzip.decompress(prepared.initrd.read_bytes()),
        capture_output=True, check=True,
    ).stdout.decode().split()  # fmt: skip
    assert {"init", "bin/busybox", "modules.order", "lib/modules/9p.ko"} <= set(listing)
    assert guest.guest_problem(prepared) is None
    manifest = json.loads((prepared.home / guest.MANIFEST).read_text())
    assert manifest["kernel_version"] == prepared.kernel_version


@pytest.mark.slow
def test_prepare_is_idempotent(prepared: guest.Guest) -> None:
    """A second prepare reuses the artefacts instead of rebuilding them."""
    before = prepared.initrd.stat().st_mtime_ns
    again = guest.prepare_guest(prepared.home)
    assert again.initrd.stat().st_mtime_ns == before


def test_preflight_names_the_missing_guest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a prepared guest the VM preflight fails and says to run sandbench vm prepare."""
    require(qemu.qemu_binary() is not None, "qemu-system-x86_64 (ops/setup.sh)")
    monkeypatch.setenv("SANDBENCH_VM_HOME", str(tmp_path / "empty"))
    verdict = VmMode().preflight(HostInfo())
    assert not verdict.ok
    assert "sandbench vm prepare" in verdict.reason


@pytest.mark.slow
@pytest.mark.parametrize(
    ("missing", "named"), [("vmlinuz", "guest kernel"), ("initrd", "initramfs")]
)
def test_preflight_names_a_missing_artefact(
    prepared: guest.Guest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str, named: str
) -> None:
    """A prepared guest whose kernel or initramfs went missing is named in the preflight."""
    require(qemu.qemu_binary() is not None, "qemu-system-x86_64 (ops/setup.sh)")
    home = tmp_path / "vm"
    shutil.copytree(prepared.home, home)
    (home / getattr(prepared, missing).name).unlink()
    monkeypatch.setenv("SANDBENCH_VM_HOME", str(home))
    verdict = VmMode().preflight(HostInfo())
    assert not verdict.ok
    assert verdict.reason.startswith(named), verdict.reason


def test_cli_status_reports_missing_guest(tmp_path: Path) -> None:
    """`sandbench vm status --json` names the problem when nothing is prepared."""
    env = {"SANDBENCH_VM_HOME": str(tmp_path), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator", "vm", "status", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert status["guest"] is None and "sandbench vm prepare" in status["problem"]


@pytest.mark.parametrize(
    ("guest_status", "launcher_status"), [(3, 0), (5, 1), (125, 61), (0, 125), (127, 127), (1, 1)]
)
def test_exit_wrapper_maps_qemu_status(
    tmp_path: Path, guest_status: int, launcher_status: int
) -> None:
    """QEMU's debug-exit status 2*(s+1)+1 becomes s; a guest without a status becomes 125."""
    console = tmp_path / "console.log"
    console.write_text("last console line\n")
    proc = subprocess.run(
        ["/bin/sh", "-c", qemu.EXIT_WRAPPER, "w", str(console), "sh", "-c", f"exit {guest_status}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == launcher_status
    assert ("last console line" in proc.stderr) == (launcher_status != 0)
    assert (qemu.CONSOLE_TAIL_MARK in proc.stderr) == (launcher_status != 0)  # failure_context


def test_console_tail_is_one_line_of_the_last_lines(tmp_path: Path) -> None:
    """A failure's console context: the last non-empty lines joined; missing or empty is said."""
    console = tmp_path / "console.log"
    assert qemu.console_tail(console) == ""  # no console at all: nothing to add
    console.write_text("")
    assert qemu.console_tail(console) == "guest console: (empty)"
    console.write_text("".join(f"line {i}\r\n\n" for i in range(40)))
    tail = qemu.console_tail(console)
    expected = " | ".join(f"line {i}" for i in range(40 - qemu.CONSOLE_TAIL_LINES, 40))
    assert tail == f"guest console: {expected}"


def test_job_file_quotes_the_payload_for_the_guest_shell(tmp_path: Path) -> None:
    """The init's shell gets the payload argv back exactly, spaces and quotes included."""
    argv = ["/usr/bin/printf", "%s|", "a b", "it's", "$HOME"]
    job = Job(workspace="/w s", kind="9p-mmap", argv=argv).write(tmp_path / "job.sh")
    script = f'. {job}; eval "env -i $PAYLOAD"; echo; echo "$WS_PATH"'
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["a b|it's|$HOME|", "/w s"]


def test_disk_image_round_trip(tmp_path: Path) -> None:
    """A workspace copied into an ext4 image comes back out byte for byte via debugfs."""
    require_binary("mkfs.ext4")
    require_binary("debugfs")
    workspace = tmp_path / "ws"
    (workspace / "d").mkdir(parents=True)
    (workspace / "d" / "f").write_bytes(bytes(range(256)) * 100)
    (workspace / "link").symlink_to("d/f")
    image = make_image(workspace, tmp_path / "img.ext4")
    extract_image(image, tmp_path / "out", workspace)
    assert (tmp_path / "out" / "d" / "f").read_bytes() == bytes(range(256)) * 100
    assert (tmp_path / "out" / "link").readlink() == Path("d/f")
    assert not (tmp_path / "out" / "lost+found").exists()
