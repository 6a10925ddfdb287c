"""The VM modes: QEMU guests that run the host's own toolset, read-only over 9p as their root.

* ``vm``: q35, workspace over 9p with no guest caching (writes reach the host before they return;
  9p ``cache=mmap`` caches only shared mappings, which 9p cannot do uncached).
* ``vm-writeback``: the same with the guest page cache (9p ``cache=loose``); each round's sync
  asks the guest to ``sync`` so the host sees the round's result before the round clock stops.
* ``vm-virtiofs``: q35, workspace over virtio-fs, served by QEMU 7.2's C virtiofsd with
  ``cache=none``: no guest page cache for the workspace's files (FUSE direct I/O) and no cached
  attributes, so writes reach the host before they return and the round's sync has nothing to
  do, as in ``vm``. Unlike 9p's ``cache=mmap`` nothing caches shared mappings: the guest's
  Linux 6.1 refuses a writable shared mapping of a direct-I/O file (ENODEV), so ``mmap-write``
  fails in this mode (a round-error, which is the result). The guest's memory is a shared memfd
  (virtiofsd maps it). virtiofsd is started by the launcher (the exit wrapper, after the
  marker: its start is inside Ready, like the guest's boot) as a child of the wrapper's shell,
  so it runs in the environment's cgroup, counts against the quota and dies with the
  launcher's tree (``worker.vm.virtiofs``); the record's preflight facts name its version,
  cache mode, thread pool and sandbox.
* ``vm-disk`` / ``vm-microvm``: q35 / microvm, the workspace copied into a private ext4 image in
  preparation; the round's sync is the guest's sync of that disk; the oracle reads the image
  (``debugfs rdump``, no loop device needed) after the VM exited.

The launcher is QEMU under a small exit wrapper (``worker.vm.qemu``): the payload's channel is a
virtio-serial port on QEMU's stdio, the kernel console goes to ``console.log`` in the env dir,
and the payload's exit status becomes the launcher's. Mode options: ``accel`` ("kvm" or "tcg")
overrides the detected accelerator (forcing "kvm" where the KVM probe boot fails is a preflight
failure with the probe's reason, decided within the probe's bound); ``guest_hold`` (tests)
makes the init never start the payload.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from contract.errors import ModeUnavailable
from worker.modes.base import STDERR_FILE, EnvContext, HostInfo, Mode, Preflight
from worker.vm import accel, guest, kernel, qemu, virtiofs
from worker.vm.job import GUEST_PAYLOAD_DIR, Job, WorkspaceKind

CONSOLE_LOG = "console.log"
JOB_FILE = "guest-job.sh"
QEMU_PIDFILE = "qemu.pid"  # in the environment's directory, for the reaper
CTL_BASE = "guest-ctl"  # fifo pair guest-ctl.in / guest-ctl.out
DISK_IMAGE = "workspace.ext4"
RESULT_DIR = "result"
MIN_IMAGE_BYTES = 4 * 1024**3  # sparse: costs only what is written
IMAGE_GROWTH = 3  # room for R rounds of new data on top of the fixture
TOOL_TIMEOUT_S = 600.0
ALWAYS_IGNORED = "lost+found"


class VmMode(Mode):
    """``vm``: q35, workspace over 9p without guest caching; the round sync has nothing to do."""

    name = "vm"
    # The guest's CPU clock runs on while the host throttles its vCPUs: cpu_quota q over v vCPUs
    # may show q/v of what the guest counts (0.25 at 0.5 core for 2 vCPUs).
    reported_cpu_floor = 0.1
    machine = "q35"
    workspace_kind: WorkspaceKind = "9p-mmap"
    guest_sync = False  # does the round's sync ask the guest to sync(2)?
    option_names = frozenset({"accel", "guest_hold"})

    def __init__(self, forced_accel: str | None = None) -> None:
        if forced_accel not in (None, "kvm", "tcg"):
            raise ModeUnavailable(f"{self.name}: accel {forced_accel!r} is not kvm or tcg")
        self.forced_accel = forced_accel

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Self:
        """The mode with the plan's ``accel`` option, which its preflight then honours."""
        forced = options.get("accel")
        return cls(str(forced) if forced else None)

    # -- preflight ------------------------------------------------------------------------
    def preflight(self, host: HostInfo) -> Preflight:
        """QEMU, the machine type, 9p, the prepared guest and (disk modes) e2fsprogs; facts."""
        problem = self._host_problem()
        if problem:
            return Preflight(False, problem, facts={"qemu": qemu.qemu_version()})
        prepared = guest.load_guest()
        assert prepared is not None
        if self.forced_accel == "kvm" and (kvm := accel.kvm_problem(prepared)):
            kvm_facts = {"qemu": qemu.qemu_version(), "accel": None, "kvm_unusable": kvm}
            return Preflight(False, forced_kvm_reason(kvm), kvm_facts)  # bounded by the probe
        verdict = accel.detect_accel(prepared)
        facts: dict[str, Any] = {
            "qemu": qemu.qemu_version(),
            "machine": self.machine,
            "accel": verdict.get("accel"),
            "accel_probe": accel.probe_summary(verdict),
            "workspace": self.workspace_kind,
            **self._workspace_facts(),
            **prepared.facts(),
        }
        if fallback := accel.fallback_reason(verdict):
            facts["kvm_unusable"] = fallback
        if verdict.get("accel") is None:
            return Preflight(False, "the guest reached Ready with neither KVM nor TCG", facts)
        return Preflight(True, facts=facts)

    def _workspace_facts(self) -> dict[str, Any]:
        """Provenance facts of the workspace's transport beyond its kind (default: none)."""
        return {}

    def _host_problem(self) -> str | None:
        """The first missing piece on this host, named so the user knows what to install."""
        if qemu.qemu_binary() is None:
            return f"{qemu.QEMU} not found: install qemu-system-x86 (ops/setup.sh)"
        if not qemu.has_machine(self.machine):
            return f"{qemu.QEMU} {qemu.qemu_version()} has no '{self.machine}' machine type"
        if not qemu.has_device(self._device("virtio-9p")):
            return f"{qemu.QEMU} lacks 9p support ({self._device('virtio-9p')})"
        if self.workspace_kind == "ext4":
            for tool in ("mkfs.ext4", "debugfs"):
                if shutil.which(tool) is None:
                    return f"{tool} not found: install e2fsprogs (ops/setup.sh)"
        return guest.guest_problem(guest.load_guest())

    def _device(self, kind: str) -> str:
        """Device model of ``kind`` on this mode's machine."""
        return f"{kind}-{'device' if self.machine == 'microvm' else 'pci'}"

    # -- one environment ------------------------------------------------------------------
    def prepare(self, env: EnvContext) -> None:
        """Job file, control fifos, disk image (disk modes); the QEMU configuration."""
        prepared = guest.load_guest()
        problem = guest.guest_problem(prepared)
        if problem or prepared is None:
            raise ModeUnavailable(problem or "no prepared guest")
        options = env.spec.mode_options
        forced = options.get("accel")
        if forced == "kvm" and (problem := accel.kvm_problem(prepared)):
            raise ModeUnavailable(forced_kvm_reason(problem))  # never a hang until the limit
        job = Job(
            workspace=str(env.workspace),
            kind=self.workspace_kind,
            argv=env.payload_argv(str(env.workspace), f"{GUEST_PAYLOAD_DIR}/{env.payload.name}"),
            payload_dir=str(env.payload_dir.resolve()),
            hold=bool(options.get("guest_hold", False)),
        )
        config = qemu.GuestConfig(
            kernel=prepared.vmlinuz,
            initrd=prepared.initrd,
            job=job.write(env.env_dir / JOB_FILE),
            console_log=env.env_dir / CONSOLE_LOG,
            pidfile=env.env_dir / QEMU_PIDFILE,
            machine=self.machine,
            accel=str(forced or accel.detect_accel(prepared).get("accel") or "tcg"),
            vcpus=env.spec.vm.vcpus,
            memory_mib=env.spec.vm.memory_mib,
            ctl_pipe=self._make_ctl(env) if self.guest_sync else None,
        )
        self._attach_workspace(env, config)
        env.state["vm_config"] = config

    def _attach_workspace(self, env: EnvContext, config: qemu.GuestConfig) -> None:
        """Export the workspace over 9p."""
        config.workspace_9p = env.workspace

    def _make_ctl(self, env: EnvContext) -> Path:
        """The fifo pair QEMU connects to the guest's sync agent."""
        base = env.env_dir / CTL_BASE
        for suffix in (".in", ".out"):
            os.mkfifo(f"{base}{suffix}", 0o600)
        return base

    def launcher(self, env: EnvContext) -> list[str]:
        """QEMU under the exit wrapper."""
        config: qemu.GuestConfig = env.state["vm_config"]
        return qemu.launcher_argv(config)

    def sync(self, env: EnvContext, round: int) -> None:
        """Ask the guest to sync(2) and wait for its answer (modes with a guest cache)."""
        if self.guest_sync:
            guest_sync(env, round)

    def failure_context(self, env: EnvContext) -> str:
        """The guest console's last lines, unless the exit wrapper already put them in stderr.

        A guest that hangs (before Ready, in a round) is killed at the limit, wrapper and all;
        its console (init's progress lines, a kernel's lockup or panic) shows where it stopped.
        """
        stderr = env.env_dir / STDERR_FILE
        with contextlib.suppress(OSError):
            if qemu.CONSOLE_TAIL_MARK in stderr.read_text(errors="replace"):
                return ""
        return qemu.console_tail(env.env_dir / CONSOLE_LOG)

    def cleanup(self, env: EnvContext) -> None:
        """Close the control fifos and remove every file this mode created (safe twice)."""
        for key in ("ctl_in", "ctl_out"):
            fd = env.state.pop(key, None)
            if fd is not None:
                os.close(fd)
        for name in (JOB_FILE, f"{CTL_BASE}.in", f"{CTL_BASE}.out", DISK_IMAGE):
            (env.env_dir / name).unlink(missing_ok=True)
        shutil.rmtree(env.env_dir / RESULT_DIR, ignore_errors=True)


def forced_kvm_reason(problem: str) -> str:
    """The preflight reason when the plan forces KVM on a host where it does not work."""
    return f'accel = "kvm" is forced but KVM is unusable here: {problem}; drop the option for TCG'


class VmWritebackMode(VmMode):
    """``vm-writeback``: the guest caches the workspace and writes back; sync at round end."""

    name = "vm-writeback"
    workspace_kind: WorkspaceKind = "9p-loose"
    guest_sync = True


class VmVirtiofsMode(VmMode):
    """``vm-virtiofs``: q35, workspace over virtio-fs (virtiofsd ``cache=none``); no round sync."""

    name = "vm-virtiofs"
    workspace_kind: WorkspaceKind = "virtiofs"
    virtiofs_cache = "none"
    virtiofs_writeback = False

    def _workspace_facts(self) -> dict[str, Any]:
        """virtiofsd's version and the options that shape its caching and threads."""
        return {
            "virtiofsd": virtiofs.version(),
            "virtiofs_cache": self.virtiofs_cache,
            "virtiofs_writeback": self.virtiofs_writeback,
            "virtiofsd_thread_pool_size": virtiofs.THREAD_POOL_SIZE,
            "virtiofsd_sandbox": virtiofs.SANDBOX,
        }

    def _host_problem(self) -> str | None:
        """The 9p modes' problems (the root is still 9p), then virtiofsd and its QEMU pieces."""
        if problem := super()._host_problem():
            return problem
        if virtiofs.binary() is None:
            return (f"{virtiofs.VIRTIOFSD} not found: install {virtiofs.PACKAGE} "
                    "(apt-get install qemu-system-x86, ops/setup.sh)")  # fmt: skip
        for kind, present in (("device", qemu.has_device(self._device("vhost-user-fs"))),
                              ("object", qemu.has_object("memory-backend-memfd"))):  # fmt: skip
            if not present:
                return f"{qemu.QEMU} {qemu.qemu_version()} lacks virtio-fs support ({kind})"
        prepared = guest.load_guest()
        assert prepared is not None  # the guest's own problems came first
        missing = [m for m in kernel.VIRTIOFS_MODULES if m not in prepared.modules]
        if missing:
            return f"initramfs lacks virtio-fs {missing}: run `sandbench vm prepare --force`"
        return None

    def _attach_workspace(self, env: EnvContext, config: qemu.GuestConfig) -> None:
        """Serve the workspace with virtiofsd, started by the launcher on a socket of its own."""
        socket = virtiofs.socket_name(env.env_dir.parent.name)
        config.virtiofs_socket = socket
        config.virtiofsd = virtiofs.daemon_argv(
            socket, env.workspace, self.virtiofs_cache, self.virtiofs_writeback
        )

    def cleanup(self, env: EnvContext) -> None:
        """The VM modes' cleanup, the daemon's socket and its lock file (safe twice)."""
        super().cleanup(env)
        socket = virtiofs.socket_name(env.env_dir.parent.name)
        (env.env_dir / socket).unlink(missing_ok=True)
        virtiofs.lock_file(socket).unlink(missing_ok=True)


class VmVirtiofsWritebackMode(VmVirtiofsMode):
    """``vm-virtiofs-writeback``: virtio-fs with the guest's page cache (virtiofsd
    ``cache=always`` with ``writeback``); each round's sync asks the guest to ``sync``, as in
    ``vm-writeback``, so the host sees the round's result before the round clock stops."""

    name = "vm-virtiofs-writeback"
    virtiofs_cache = "always"
    virtiofs_writeback = True
    guest_sync = True


class VmDiskMode(VmMode):
    """``vm-disk``: q35 with the workspace staged onto a private ext4 disk image."""

    name = "vm-disk"
    workspace_kind: WorkspaceKind = "ext4"
    guest_sync = True

    def _attach_workspace(self, env: EnvContext, config: qemu.GuestConfig) -> None:
        """Copy the workspace into a fresh ext4 image (not timed) and attach it."""
        config.disk_image = make_image(env.workspace, env.env_dir / DISK_IMAGE)

    def result_root(self, env: EnvContext) -> Path:
        """The image's contents, extracted once after the VM exited."""
        result = env.env_dir / RESULT_DIR
        if not result.exists():
            extract_image(env.env_dir / DISK_IMAGE, result, env.workspace)
        return result


class VmMicrovmMode(VmDiskMode):
    """``vm-microvm``: QEMU's microvm machine (virtio-mmio), private ext4 disk image."""

    name = "vm-microvm"
    machine = "microvm"


# -- the round sync ---------------------------------------------------------------------------
def guest_sync(env: EnvContext, round: int) -> None:
    """Send ``round`` to the guest's sync agent and wait for ``synced round`` (bounded)."""
    config: qemu.GuestConfig = env.state["vm_config"]
    assert config.ctl_pipe is not None
    if "ctl_in" not in env.state:
        # Non-blocking opens: QEMU holds both fifos open read-write, so these never wait.
        env.state["ctl_in"] = os.open(f"{config.ctl_pipe}.in", os.O_WRONLY | os.O_NONBLOCK)
        env.state["ctl_out"] = os.open(f"{config.ctl_pipe}.out", os.O_RDONLY | os.O_NONBLOCK)
    os.write(env.state["ctl_in"], f"{round}\n".encode())
    expected = f"synced {round}\n".encode()
    deadline = time.monotonic() + env.remaining_s()  # the environment's limit bounds the sync
    reply = b""
    while not reply.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([env.state["ctl_out"]], [], [], left)[0]:
            raise TimeoutError(f"the guest did not finish sync of round {round} within the limit")
        reply += os.read(env.state["ctl_out"], 256)
    if reply != expected:
        raise OSError(f"guest sync agent answered {reply!r}, expected {expected!r}")


# -- the private disk image -------------------------------------------------------------------
def _tree_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root``."""
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            total += os.lstat(os.path.join(directory, name)).st_size
    return total


def _tool(argv: list[str]) -> list[str]:
    """Run an e2fsprogs tool; raise on failure, else return its stderr lines but the banner."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise OSError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return [line for line in proc.stderr.splitlines() if line and not line.startswith("debugfs ")]


def make_image(workspace: Path, image: Path) -> Path:
    """A sparse ext4 image holding a copy of ``workspace`` (mkfs.ext4 -d)."""
    size = max(MIN_IMAGE_BYTES, IMAGE_GROWTH * _tree_bytes(workspace))
    with open(image, "wb") as fh:
        fh.truncate(size)
    _tool([
        "mkfs.ext4", "-q", "-F", "-L", "sandbench", "-d", str(workspace),
        "-E", "lazy_itable_init=1,lazy_journal_init=1", str(image),
    ])  # fmt: skip
    return image


def extract_image(image: Path, dest: Path, original: Path) -> None:
    """Copy the image's tree to ``dest`` with ``debugfs rdump`` (read-only, no loop device)."""
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    errors = _tool(["debugfs", "-R", f"rdump / {partial}", str(image)])
    if errors:  # debugfs exits 0 even when a file could not be dumped
        raise OSError(f"debugfs rdump of {image}: {'; '.join(errors[:3])}")
    found = partial / ALWAYS_IGNORED
    if found.is_dir() and not (original / ALWAYS_IGNORED).exists() and not any(found.iterdir()):
        found.rmdir()
    partial.rename(dest)
