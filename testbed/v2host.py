"""A cgroup v2 lab host as a guest: run one command on a pure cgroup v2 machine made here.

The prepared guest kernel (``sandbench vm prepare``) boots with ``cgroup_no_v1=all`` and its
own initramfs (``v2host_init.sh``): the host root read-only over 9p, a fresh sparse ext4
scratch disk for /tmp, /var/tmp (the default work root) and /var/lib/sandbench (keys, the
private dockerd's state), the repository, sandbench's own tools (``contract.paths.tools_dir``, e.g.
nsjail: hidden with /var/lib/sandbench otherwise) and any other shared directory read-write at
its host path, cgroup2 at /sys/fs/cgroup with cpu, cpuset, memory, pids and io, 2 vCPUs and 4 GiB.
The command runs in a cgroup delegated as systemd's ``Delegate=yes`` does it (or, with
``--placement root``, in the root cgroup, as a root shell outside any service); its stdout and
stderr are this process's, and its exit status is this process's. ``ops/v2-host.sh`` is the
entry point.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from contract.environ import inherited, setting
from contract.errors import SandbenchError, V2HostError
from contract.paths import DEFAULT_HOME, tools_dir
from worker.procs import owned_process
from worker.vm import accel, guest, qemu

REPO = Path(__file__).resolve().parents[1]
SERVICE = "/system.slice/sandbench-v2host.service"  # the emulated delegated unit's cgroup
KERNEL_ARGS = ["cgroup_no_v1=all"]
TCG_CPU = "max"  # the venv's numpy needs x86-64-v2 (SSE4.2, POPCNT); qemu64 has not
HIDDEN = ("/tmp", "/var/tmp", str(DEFAULT_HOME))  # on the scratch disk in the guest
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "TZ", "CI", "PYTEST_ADDOPTS")
GUEST_ENV = {"XDG_CACHE_HOME": "/tmp/.cache", "MPLCONFIGDIR": "/tmp/.config/matplotlib"}
STATUS_FILE, CONSOLE_LOG, JOB_FILE, SCRATCH = "status", "console.log", "job.sh", "scratch.ext4"
STATUS_NONE = 125  # the guest stopped without reporting the command's status
STATUS_TIMEOUT = 124
CONSOLE_TAIL_LINES = 25
POLL_S = 0.2
RELAY_WAIT_S = 5.0


@dataclass
class Settings:
    """How to build the v2 host for one command."""

    memory_mib: int = 4096
    vcpus: int = 2
    accel: str | None = None  # None: the cached probe's verdict (KVM if it works, else TCG)
    placement: str = "delegated"  # or "root"
    shares: list[Path] = field(default_factory=lambda: [REPO])
    scratch_gib: int = 64  # sparse: costs only what the guest writes
    timeout_s: float | None = None
    keep: Path | None = None  # keep the console log and scratch disk here


def guest_env() -> dict[str, str]:
    """The command's environment in the guest: a few of ours, every SANDBENCH_*, cache dirs."""
    env = {k: v for k, v in inherited().items() if k in PASSED_ENV or k.startswith("SANDBENCH_")}
    return {**env, **GUEST_ENV}


def guest_cwd(shares: list[Path]) -> Path:
    """Our working directory if the guest sees it (host root or a share), else the first share."""
    cwd = Path.cwd()
    if any(cwd == s or s in cwd.parents for s in shares):
        return cwd
    if any(cwd == Path(h) or Path(h) in cwd.parents for h in HIDDEN):
        return shares[0]
    return cwd


def job_script(argv: list[str], settings: Settings) -> str:
    """The job file the init sources: shell assignments, each value quoted once for ``eval``."""
    env = [f"{k}={v}" for k, v in sorted(guest_env().items())]
    values = {
        "CWD": shlex.quote(str(guest_cwd(settings.shares))),
        "ARGV": shlex.join(argv),
        "GUEST_ENV": shlex.join(env),
        "SHARES": " ".join(str(s) for s in settings.shares),
        "PLACEMENT": settings.placement,
        "SERVICE": SERVICE,
        "NAME": f"{socket.gethostname().split('.')[0]}-v2",
    }
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


def seed_tree(seed: Path) -> Path:
    """The scratch disk's initial tree: our font cache, so matplotlib need not rebuild it."""
    cache = Path(setting("XDG_CACHE_HOME") or Path.home() / ".cache") / "matplotlib"
    target = seed / "tmp" / GUEST_ENV["XDG_CACHE_HOME"].removeprefix("/tmp/") / "matplotlib"
    target.mkdir(parents=True)
    for font_list in cache.glob("fontlist-*.json"):  # ~40 s under TCG when missing
        shutil.copy2(font_list, target)
    return seed


def make_scratch(path: Path, gib: int) -> Path:
    """A sparse ext4 image of ``gib`` GiB holding ``seed_tree``."""
    with open(path, "wb") as fh:
        fh.truncate(gib << 30)
    seed = seed_tree(path.with_suffix(".seed"))
    proc = subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-L", "v2host-scratch", "-d", str(seed),
         "-E", "lazy_itable_init=1,lazy_journal_init=1", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    shutil.rmtree(seed)
    if proc.returncode != 0:
        raise V2HostError(f"mkfs.ext4 {path} failed: {proc.stderr.strip()}")
    return path


def device_args(work: Path, shares: list[Path], stderr_fd: int) -> list[str]:
    """The shared directories (9p, read-write) and the stderr (to ``stderr_fd``) and status ports.

    The command's stderr goes through a pipe this process relays: a file QEMU opened itself
    would have its own offset and overwrite what the caller's shell writes to the same file.
    """
    args: list[str] = []
    for i, share in enumerate(shares):
        args += [
            "-fsdev", f"local,id=share{i},path={share},security_model=none,multidevs=remap",
            "-device", f"virtio-9p-pci,fsdev=share{i},mount_tag=share{i}",
        ]  # fmt: skip
    for name, target in (("stderr", f"/proc/self/fd/{stderr_fd}"), ("status", work / STATUS_FILE)):
        args += [
            "-chardev", f"file,id={name},path={target}",
            "-device", f"virtserialport,bus=vser.0,chardev={name},name=sandbench-{name}",
        ]  # fmt: skip
    return args


def qemu_config(
    work: Path, argv: list[str], settings: Settings, stderr_fd: int
) -> qemu.GuestConfig:
    """The QEMU configuration of the v2 host for ``argv``."""
    prepared = guest.load_guest()
    problem = guest.v2host_problem(prepared)
    if problem or prepared is None or prepared.v2host_initrd is None:
        raise V2HostError(f"cannot boot the v2 host: {problem}")
    if settings.accel == "kvm" and (kvm := accel.kvm_problem(prepared)):
        raise V2HostError(f"--accel kvm is forced but KVM is unusable here: {kvm}; leave "
                          f"--accel out for the probe's verdict")  # fmt: skip
    (work / JOB_FILE).write_text(job_script(argv, settings))
    (work / JOB_FILE).chmod(0o644)
    return qemu.GuestConfig(
        kernel=prepared.vmlinuz, initrd=prepared.v2host_initrd, job=work / JOB_FILE,
        console_log=work / CONSOLE_LOG, accel=settings.accel or _detected_accel(prepared),
        vcpus=settings.vcpus, memory_mib=settings.memory_mib, tcg_cpu=TCG_CPU,
        disk_image=make_scratch(work / SCRATCH, settings.scratch_gib),
        extra_kernel_args=KERNEL_ARGS, extra_args=device_args(work, settings.shares, stderr_fd),
    )  # fmt: skip


def _detected_accel(prepared: guest.Guest) -> str:
    """The probe's accelerator (KVM when a probe boot reached Ready), else TCG."""
    return str(accel.detect_accel(prepared).get("accel") or "tcg")


def run(argv: list[str], settings: Settings) -> int:
    """Boot the v2 host, run ``argv`` in it and return its exit status."""
    if qemu.qemu_binary() is None:
        raise V2HostError(f"{qemu.QEMU} not found: install qemu-system-x86 (ops/setup.sh)")
    if not argv:
        raise V2HostError("no command given: ops/v2-host.sh CMD [ARGS...]")
    with tempfile.TemporaryDirectory(prefix="sandbench-v2host-", dir="/var/tmp") as tmp:
        work = settings.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        err_r, err_w = os.pipe()
        relay = threading.Thread(target=_relay, args=(err_r, sys.stderr.fileno()), daemon=True)
        relay.start()
        try:
            config = qemu_config(work, argv, settings, err_w)
            # stdin stays an open pipe: on EOF QEMU's stdio chardev drops what the guest writes.
            with owned_process(
                qemu.qemu_argv(config), stdin=subprocess.PIPE, pass_fds=(err_w,)
            ) as proc:
                os.close(err_w)
                err_w = -1
                timed_out = _wait(proc, settings.timeout_s)
        finally:
            if err_w >= 0:
                os.close(err_w)
            relay.join(RELAY_WAIT_S)
        return _status(work, timed_out, settings.timeout_s)


def _relay(source: int, target: int) -> None:
    """Copy ``source`` to ``target`` until end of file, then close ``source``."""
    try:
        while chunk := os.read(source, 65536):
            os.write(target, chunk)
    finally:
        os.close(source)


def _wait(proc: subprocess.Popen[bytes], timeout_s: float | None) -> bool:
    """Wait for QEMU to exit; True if ``timeout_s`` passed first."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while proc.poll() is None:
        if deadline is not None and time.monotonic() > deadline:
            return True
        time.sleep(POLL_S)
    return False


def _status(work: Path, timed_out: bool, timeout_s: float | None) -> int:
    """The command's exit status from the status port; say why when there is none."""
    text = (work / STATUS_FILE).read_text().strip() if (work / STATUS_FILE).exists() else ""
    if text.isdigit():
        return int(text)
    if timed_out:
        why = f"the command did not finish within {timeout_s:g} s; the v2 host was stopped"
    elif text:
        why = f"the v2 host could not run the command ({text})"
    else:
        why = "the v2 host stopped without reporting the command's status"
    tail = (work / CONSOLE_LOG).read_text(errors="replace").splitlines()[-CONSOLE_TAIL_LINES:]
    print(f"sandbench-v2host: {why}; console tail:", *tail, sep="\n  ", file=sys.stderr)
    return STATUS_TIMEOUT if timed_out else STATUS_NONE


def parse(args: list[str]) -> tuple[list[str], Settings]:
    """The command and the settings from ``ops/v2-host.sh``'s arguments."""
    parser = argparse.ArgumentParser(
        prog="ops/v2-host.sh", description="Run CMD on a cgroup v2 lab host booted as a guest."
    )
    parser.add_argument("--memory-mib", type=int, default=Settings.memory_mib)
    parser.add_argument("--accel", choices=("kvm", "tcg"), default=None)
    parser.add_argument("--placement", choices=("delegated", "root"), default="delegated")
    parser.add_argument("--share", type=Path, action="append", default=[],
                        help="another host directory, read-write at the same path")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=None, help="seconds; exit status 124")
    parser.add_argument("--keep", type=Path, default=None, help="keep console log and scratch")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    ns = parser.parse_args(args)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    tools = [tools_dir().resolve()] if tools_dir().is_dir() else []  # what ops/setup.sh installed
    shares = [REPO, *tools, *(p.resolve() for p in ns.share)]
    settings = Settings(
        memory_mib=ns.memory_mib, accel=ns.accel, placement=ns.placement, shares=shares,
        timeout_s=ns.timeout, keep=ns.keep,
    )  # fmt: skip
    return command, settings


def main(args: list[str] | None = None) -> int:
    """``ops/v2-host.sh [OPTIONS] CMD [ARGS...]``: CMD's exit status (2: cannot start)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    command, settings = parse(sys.argv[1:] if args is None else args)
    try:
        return run(command, settings)
    except SandbenchError as exc:
        print(f"sandbench-v2host: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
