"""QEMU command lines for the VM modes, and what the installed QEMU supports."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from worker.vm import virtiofs

QEMU = "qemu-system-x86_64"
PAYLOAD_PORT = "sandbench"
CTL_PORT = "sandbench-ctl"
DEBUG_EXIT_PORT = "0xf4"
KERNEL_ARGS = "console=ttyS0 quiet panic=-1 reboot=t tsc=reliable no_timer_check i8042.noaux"

CONSOLE_TAIL_MARK = "sandbench-vm: guest console tail:"  # the wrapper's line before the tail
CONSOLE_TAIL_LINES = 12
RUN_QEMU = '"$@"\ns=$?\n'  # the exit wrapper's QEMU: its argv is the wrapper's
# QEMU's exit status is 2*v+1 for a value v the guest writes to isa-debug-exit; the init writes
# v = payload status + 1 (1..62), so this wrapper turns QEMU's status back into the payload's.
# 0 means the guest stopped without reporting (crash, panic): that must not look like success.
EXIT_STATUS = rf"""
if [ "$s" -ge 3 ] && [ "$s" -le 125 ] && [ $((s % 2)) -eq 1 ]; then s=$(((s - 3) / 2));
elif [ "$s" -eq 0 ]; then echo "sandbench-vm: guest stopped without a status" >&2; s=125; fi
if [ "$s" -ne 0 ]; then
  echo "{CONSOLE_TAIL_MARK}" >&2; tail -n {CONSOLE_TAIL_LINES} "$console" >&2
fi
exit "$s"
"""
WRAPPER_ARGS = "\nconsole=$1; shift\n"
EXIT_WRAPPER = f"{WRAPPER_ARGS}{RUN_QEMU}{EXIT_STATUS}"
GUEST_STOPPED_STATUS = 125
CONSOLE_TAIL_BYTES = 800


def console_tail(path: Path) -> str:
    """The console log's last lines, one line of text ("guest console: a | b"), or ""."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - 8 * CONSOLE_TAIL_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()][-CONSOLE_TAIL_LINES:]
    joined = " | ".join(lines)[-CONSOLE_TAIL_BYTES:]
    return f"guest console: {joined}" if joined else "guest console: (empty)"


def qemu_binary() -> str | None:
    """Path of qemu-system-x86_64, or None."""
    return shutil.which(QEMU)


@functools.cache
def _query(*args: str) -> str:
    """Output of ``qemu-system-x86_64 ARGS`` (cached: it does not change within a process)."""
    binary = qemu_binary()
    if binary is None:
        return ""
    proc = subprocess.run([binary, *args], capture_output=True, text=True, timeout=30, check=False)
    return proc.stdout + proc.stderr


def qemu_version() -> str:
    """QEMU's version string (e.g. ``7.2.22``), or empty when QEMU is missing."""
    match = re.search(r"version (\S+)", _query("--version"))
    return match.group(1) if match else ""


def has_device(name: str) -> bool:
    """Whether QEMU knows device ``name``."""
    return re.search(rf'name "{re.escape(name)}"', _query("-device", "help")) is not None


def has_object(name: str) -> bool:
    """Whether QEMU knows object type ``name`` (e.g. a memory backend)."""
    return (
        re.search(rf"^\s*{re.escape(name)}$", _query("-object", "help"), re.MULTILINE) is not None
    )


def has_machine(name: str) -> bool:
    """Whether QEMU knows machine type ``name``."""
    return re.search(rf"^{re.escape(name)}\s", _query("-machine", "help"), re.MULTILINE) is not None


@dataclass
class GuestConfig:
    """Everything one QEMU invocation needs."""

    kernel: Path
    initrd: Path
    job: Path  # job file the init sources (host path, visible in the guest through the root)
    console_log: Path
    machine: str = "q35"  # or "microvm"
    accel: str = "tcg"  # or "kvm"
    tcg_cpu: str | None = None  # TCG's CPU model (default qemu64; "max" has SSE4, AVX for numpy)
    vcpus: int = 2
    memory_mib: int = 512
    workspace_9p: Path | None = None  # exported read-write as mount tag "ws"
    # The workspace over virtio-fs instead: virtiofsd's command line (the launcher starts it)
    # and its vhost-user socket, relative to the launcher's directory (the environment's).
    virtiofsd: list[str] | None = None
    virtiofs_socket: str = ""
    disk_image: Path | None = None  # raw ext4 image attached as the first virtio disk
    ctl_pipe: Path | None = None  # fifo pair base name (<path>.in/.out) for the sync agent
    pidfile: Path | None = None  # QEMU writes its pid here (the reaper finds a stray VM by it)
    extra_kernel_args: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)  # more devices (the v2 host's shares)


def _dev(config: GuestConfig, kind: str) -> str:
    """Device model of ``kind`` on this machine: PCI on q35, MMIO on microvm."""
    return f"{kind}-{'device' if config.machine == 'microvm' else 'pci'}"


def _accel_args(config: GuestConfig) -> list[str]:
    """Accelerator arguments: KVM with the host CPU, or multi-threaded TCG."""
    if config.accel == "kvm":
        return ["-accel", "kvm", "-cpu", "host"]
    cpu = ["-cpu", config.tcg_cpu] if config.tcg_cpu else []
    return ["-accel", "tcg,thread=multi", *cpu]


def _machine_args(config: GuestConfig) -> list[str]:
    """Machine type, size and the debug-exit device."""
    machine = "microvm,x-option-roms=off,rtc=on" if config.machine == "microvm" else "q35"
    return [
        "-M", machine, "-m", str(config.memory_mib), "-smp", str(config.vcpus),
        "-device", f"isa-debug-exit,iobase={DEBUG_EXIT_PORT},iosize=0x04",
    ]  # fmt: skip


def _fs_args(config: GuestConfig) -> list[str]:
    """The host root (read-only) and, if any, the workspace over 9p; the disk image."""
    nine_p = _dev(config, "virtio-9p")
    args = [
        "-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
        "-device", f"{nine_p},fsdev=hostroot,mount_tag=hostroot",
    ]  # fmt: skip
    if config.workspace_9p is not None:
        args += [
            "-fsdev", f"local,id=ws,path={config.workspace_9p},security_model=none",
            "-device", f"{nine_p},fsdev=ws,mount_tag=ws",
        ]  # fmt: skip
    if config.virtiofsd is not None:
        args += _virtiofs_args(config)
    if config.disk_image is not None:
        args += [
            "-drive", f"file={config.disk_image},format=raw,if=none,id=disk,cache=writeback",
            "-device", f"{_dev(config, 'virtio-blk')},drive=disk",
        ]  # fmt: skip
    return args


def _virtiofs_args(config: GuestConfig) -> list[str]:
    """The workspace as virtio-fs tag "ws": virtiofsd maps the guest's memory, so all of it is
    one shared memfd (the size of ``-m``) as the guest's only NUMA node."""
    return [
        "-object", f"memory-backend-memfd,id=mem,size={config.memory_mib}M,share=on",
        "-numa", "node,memdev=mem",
        "-chardev", f"socket,id=vfs,path={config.virtiofs_socket}",
        "-device", f"{_dev(config, 'vhost-user-fs')},chardev=vfs,tag=ws",
    ]  # fmt: skip


def _port_args(config: GuestConfig) -> list[str]:
    """The payload's channel on QEMU's stdio and the sync agent's fifo, as virtio-serial ports."""
    args = [
        "-device", f"{_dev(config, 'virtio-serial')},id=vser",
        "-chardev", "stdio,id=payload,signal=off",
        "-device", f"virtserialport,bus=vser.0,chardev=payload,name={PAYLOAD_PORT}",
    ]  # fmt: skip
    if config.ctl_pipe is not None:
        args += [
            "-chardev", f"pipe,id=ctl,path={config.ctl_pipe}",
            "-device", f"virtserialport,bus=vser.0,chardev=ctl,name={CTL_PORT}",
        ]  # fmt: skip
    return args


def host_tsc_khz() -> int | None:
    """The host CPU's clock in kHz (``cpu MHz`` of /proc/cpuinfo), or None if unknown."""
    try:
        match = re.search(
            r"^cpu MHz\s*:\s*([0-9.]+)", Path("/proc/cpuinfo").read_text(), re.MULTILINE
        )
    except OSError:
        return None
    return round(float(match.group(1)) * 1000) if match else None


def _kernel_args(config: GuestConfig) -> str:
    """The guest kernel's command line."""
    args = [KERNEL_ARGS, f"sandbench.job={config.job}"]
    khz = host_tsc_khz()
    if config.machine == "microvm" and config.accel == "tcg" and khz:
        # microvm has no HPET or PM timer to calibrate the TSC against; on a busy host the PIT
        # calibration fails and the boot stalls. TCG's guest TSC ticks at the host's rate.
        args.append(f"tsc_early_khz={khz}")
    return " ".join(args + config.extra_kernel_args)


def qemu_argv(config: GuestConfig) -> list[str]:
    """The QEMU command line (without the exit wrapper)."""
    append = _kernel_args(config)
    return [
        qemu_binary() or QEMU,
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        *_accel_args(config),
        *_machine_args(config),
        "-kernel", str(config.kernel), "-initrd", str(config.initrd), "-append", append,
        "-serial", f"file:{config.console_log}",
        *_fs_args(config),
        *_port_args(config),
        *(["-pidfile", str(config.pidfile)] if config.pidfile else []),
        *config.extra_args,
    ]  # fmt: skip


def launcher_argv(config: GuestConfig) -> list[str]:
    """QEMU under the exit wrapper: the launcher exits with the payload's status.

    With a virtio-fs workspace the wrapper starts virtiofsd before QEMU and waits for it after.
    """
    wrapper = EXIT_WRAPPER
    if config.virtiofsd is not None:
        start = virtiofs.start_step(config.virtiofsd, config.virtiofs_socket)
        wrapper = f"{WRAPPER_ARGS}{start}{RUN_QEMU}{virtiofs.STOP_STEP}{EXIT_STATUS}"
    return ["/bin/sh", "-c", wrapper, "sandbench-vm", str(config.console_log), *qemu_argv(config)]
