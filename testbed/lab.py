"""A lab of systemd hosts booted on this machine: ``ops/lab.sh`` (the fleet tried on one machine).

Each lab host is a QEMU guest of the kernel ``sandbench vm prepare`` fetched: systemd as PID 1 on
this machine's root, read-only over 9p, under an overlay whose upper layer is the guest's own
sparse ext4 scratch disk (every write, ``/etc``, ``/var``, ``/opt`` and ``/tmp`` included, goes
there; ``/var/tmp``, the work root, is the scratch file system itself, not the overlay); cgroup v2
unified (systemd 252's default); 2 vCPUs, so the quota's CPUs 0,1 exist; its own hostname
(``lab-a``, ``lab-b``, ...), machine-id and SSH host key, made on the first boot of its disk
(``lab_init.sh``); none of this machine's services or sandbench state.

The hosts share a bridge in a network namespace this module creates (``sandbench-lab-<id>``):
each guest's tap is there, nothing routes out of it, and this machine reaches the guests only by
entering it (``ops/lab.sh ssh``). Addresses are ``10.77.0.11``, ``.12``, ... in the order of the
names, ``10.77.0.1`` the namespace's own end; every guest's ``/etc/hosts`` names them all.

The lab directory (default ``/var/lib/sandbench-lab``) holds the lab's SSH key and known hosts,
the initramfs, one directory per host (identity, scratch disk, console log, QEMU's pid) and
``share/``, mounted read-only at ``/media/lab`` in every guest (as a USB stick would be): the
wheelhouse for an offline install goes there (``ops/lab.sh wheels``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from contract.environ import setting
from contract.errors import LabError
from worker.provenance import COMMIT_FILE, git_commit
from worker.vm import guest, initramfs, kernel, qemu

REPO = Path(__file__).resolve().parents[1]
GUEST_OWN_DIRS = (Path("/tmp"), Path("/var/tmp"))  # each guest's own (lab_init.sh), not this root's
INIT_SCRIPT = Path(__file__).with_name("lab_init.sh")
DEFAULT_DIR = Path("/var/lib/sandbench-lab")
SUBNET = "10.77.0"
PREFIX_LEN = 24
FIRST_HOST = 11  # lab-a is 10.77.0.11
MAX_HOSTS = 26
DEFAULT_MEMORY_MIB = 3072  # the quota's 2 GiB and the host around it
VCPUS = 2
SCRATCH_GIB = 24  # sparse: costs what the guest writes
TCG_CPU = "max"  # the venv's numpy needs x86-64-v2 (SSE4.2, POPCNT)
STATE_FILE = "lab.json"
BOOT_TIMEOUT_S = 600.0  # a first boot under TCG on a busy 2-core machine
SSH_CONNECT_S = 10
KILL_WAIT_S = 10.0
POLL_S = 1.0


@dataclass
class LabHost:
    """One lab host: its name, place on the network, size and clock."""

    name: str
    index: int  # 0 for lab-a
    memory_mib: int = DEFAULT_MEMORY_MIB
    clock_offset_s: int = 0  # its clock is this far ahead of this machine's (negative: behind)

    @property
    def address(self) -> str:
        """The host's address on the lab network."""
        return f"{SUBNET}.{FIRST_HOST + self.index}"

    @property
    def mac(self) -> str:
        """The MAC address of its network card (its identity file matches on it)."""
        return f"52:54:00:77:00:{FIRST_HOST + self.index:02x}"

    @property
    def tap(self) -> str:
        """Its tap device in the lab's network namespace."""
        return f"tap{self.index}"


@dataclass
class Lab:
    """A lab: its directory, network namespace and hosts (``lab.json`` in the directory)."""

    dir: Path
    netns: str
    hosts: list[LabHost] = field(default_factory=list)

    # --- the lab's files -----------------------------------------------------------------------
    @property
    def share(self) -> Path:
        """Read-only at ``/media/lab`` in every guest."""
        return self.dir / "share"

    @property
    def key(self) -> Path:
        """The lab's SSH private key (root's authorized key on every host)."""
        return self.dir / "ssh" / "id_ed25519"

    @property
    def initrd(self) -> Path:
        """The lab hosts' initramfs."""
        return self.dir / "initrd.gz"

    def host(self, name: str) -> LabHost:
        """The host called ``name``."""
        for host in self.hosts:
            if host.name == name:
                return host
        names = ", ".join(h.name for h in self.hosts)
        raise LabError(f"no lab host {name!r} in {self.dir} (hosts: {names})")

    def host_dir(self, host: LabHost) -> Path:
        """The host's files on this machine."""
        return self.dir / "hosts" / host.name

    def save(self) -> None:
        """Write ``lab.json``."""
        data = {"netns": self.netns, "hosts": [asdict(h) for h in self.hosts]}
        tmp = self.dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.dir / STATE_FILE)

    @classmethod
    def load(cls, directory: Path) -> Lab:
        """The lab in ``directory``."""
        try:
            data = json.loads((directory / STATE_FILE).read_text())
            hosts = [LabHost(**h) for h in data["hosts"]]
            return cls(directory, str(data["netns"]), hosts)
        except FileNotFoundError:
            raise LabError(f"no lab in {directory}: run ops/lab.sh up N first") from None
        except (ValueError, KeyError, TypeError) as exc:
            damaged = directory / STATE_FILE
            raise LabError(f"{damaged} is damaged ({exc}): ops/lab.sh down") from None

    # --- reaching the hosts ----------------------------------------------------------------------
    def in_netns(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the lab's network namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def ssh_argv(self, name: str, command: str | None = None, *, tty: bool = False) -> list[str]:
        """The ssh command line that runs ``command`` (a shell line) as root on host ``name``."""
        host = self.host(name)
        argv = [
            "ssh", "-F", "none", "-i", str(self.key),
            "-o", f"UserKnownHostsFile={self.dir / 'ssh' / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=accept-new", "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={SSH_CONNECT_S}", "-o", "LogLevel=ERROR",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=6",
            "-t" if tty else "-T", f"root@{host.address}",
        ]  # fmt: skip
        if command is not None:
            argv += ["--", command]
        return self.in_netns(argv)

    def run(
        self,
        name: str,
        command: str,
        *,
        input: str | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on host ``name``; raise with its output if it fails and ``check``."""
        proc = subprocess.run(
            self.ssh_argv(name, command), input=input, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise LabError(
                f"{name}: `{command}` exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
            )
        return proc

    def put(self, name: str, path: str, text: str, mode: int = 0o644) -> None:
        """Write ``text`` to ``path`` on host ``name`` (as copying a file there would)."""
        quoted = shlex.quote(path)
        self.run(name, f"umask 077 && cat > {quoted} && chmod {mode:o} {quoted}", input=text)

    def pid(self, host: LabHost) -> int | None:
        """QEMU's pid for ``host`` if it runs, else None."""
        try:
            pid = int((self.host_dir(host) / "qemu.pid").read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid


# --- making and removing a lab ------------------------------------------------------------------
def host_names(count: int) -> list[str]:
    """``lab-a``, ``lab-b``, ... for ``count`` hosts."""
    if not 1 <= count <= MAX_HOSTS:
        raise LabError(f"a lab has 1 to {MAX_HOSTS} hosts, not {count}")
    return [f"lab-{chr(ord('a') + i)}" for i in range(count)]


def netns_name(directory: Path) -> str:
    """The network namespace of the lab in ``directory`` (two labs never share one)."""
    return "sandbench-lab-" + hashlib.sha256(str(directory).encode()).hexdigest()[:8]


def _sh(argv: list[str], what: str) -> str:
    """Run a set-up command; raise with its output when it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"{what} failed: `{shlex.join(argv)}`: {proc.stderr.strip()}")
    return proc.stdout


def build_initrd(lab: Lab) -> Path:
    """The lab hosts' initramfs: the prepared guest's modules and ``lab_init.sh``."""
    prepared = guest.load_guest()
    problem = guest.modules_problem(prepared, kernel.LAB_MODULES)
    if problem or prepared is None or prepared.modules_dir is None:
        raise LabError(f"cannot boot lab hosts: {problem}")
    initramfs.build_initramfs(
        prepared.modules_dir, list(prepared.all_modules), lab.initrd, init=INIT_SCRIPT
    )
    return prepared.vmlinuz


def make_network(lab: Lab) -> None:
    """The lab's namespace, its bridge (``10.77.0.1``) and one tap per host on it."""
    if lab.netns in _sh(["ip", "netns", "list"], "listing network namespaces").split():
        raise LabError(f"network namespace {lab.netns} exists: ops/lab.sh down --dir {lab.dir}")
    _sh(["ip", "netns", "add", lab.netns], "creating the lab's network namespace")
    ns = ["ip", "-n", lab.netns]
    _sh([*ns, "link", "set", "lo", "up"], "loopback")
    _sh([*ns, "link", "add", "br0", "type", "bridge"], "the lab bridge")
    _sh([*ns, "addr", "add", f"{SUBNET}.1/{PREFIX_LEN}", "dev", "br0"], "the bridge address")
    _sh([*ns, "link", "set", "br0", "up"], "the bridge")
    for host in lab.hosts:
        _sh([*ns, "tuntap", "add", "dev", host.tap, "mode", "tap"], f"{host.name}'s tap")
        _sh([*ns, "link", "set", host.tap, "master", "br0", "up"], f"{host.name}'s tap")


def identity(lab: Lab, host: LabHost) -> str:
    """The host's identity file (shell assignments the init sources)."""
    hosts = "\n".join(f"{h.address} {h.name}" for h in lab.hosts)
    values = {
        "NAME": host.name,
        "ADDRESS": f"{host.address}/{PREFIX_LEN}",
        "MAC": host.mac,
        "HOSTS": hosts,
        "AUTHORIZED_KEY": lab.key.with_suffix(".pub").read_text().strip(),
    }
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


def make_scratch(path: Path) -> None:
    """A sparse, empty ext4 image of ``SCRATCH_GIB`` GiB."""
    with open(path, "wb") as fh:
        fh.truncate(SCRATCH_GIB << 30)
    _sh(["mkfs.ext4", "-q", "-F", "-L", "lab-scratch", "-E",
         "lazy_itable_init=0,lazy_journal_init=1", str(path)], f"mkfs.ext4 {path}")  # fmt: skip


def up(directory: Path, count: int, memory_mib: int, offsets: dict[str, int]) -> Lab:
    """Make a lab of ``count`` hosts in ``directory`` and boot them all (not waiting)."""
    if qemu.qemu_binary() is None:
        raise LabError(f"{qemu.QEMU} not found: install qemu-system-x86 (ops/setup.sh)")
    if shutil.which("sshd", path="/usr/sbin:/usr/bin") is None:
        raise LabError("no sshd on this machine (its root is the lab hosts'): install "
                       "openssh-server (ops/setup.sh)")  # fmt: skip
    if (directory / STATE_FILE).exists():
        raise LabError(f"a lab already exists in {directory}: ops/lab.sh down --dir {directory}")
    hidden = [d for d in GUEST_OWN_DIRS if d == REPO or d in REPO.parents]
    if hidden:
        own = " and ".join(map(str, GUEST_OWN_DIRS))
        raise LabError(f"the repository is at {REPO}, under {hidden[0]}: the lab hosts see this "
                       f"machine's root except {own} (each has its own), so they would not find "
                       "ops/install.sh; clone it elsewhere")  # fmt: skip
    names = host_names(count)
    unknown = sorted(set(offsets) - set(names))
    if unknown:
        raise LabError(f"--clock-offset names no lab host: {', '.join(unknown)}")
    directory.mkdir(parents=True, exist_ok=True)
    hosts = [LabHost(n, i, memory_mib, offsets.get(n, 0)) for i, n in enumerate(names)]
    lab = Lab(directory.resolve(), netns_name(directory.resolve()), hosts)
    (lab.dir / "ssh").mkdir(mode=0o700, exist_ok=True)
    lab.share.mkdir(exist_ok=True)
    _sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sandbench-lab", "-f",
         str(lab.key)], "the lab's SSH key")  # fmt: skip
    lab.save()
    build_initrd(lab)
    make_network(lab)
    for host in hosts:
        hdir = lab.host_dir(host)
        hdir.mkdir(parents=True)
        (hdir / "identity").write_text(identity(lab, host))
        make_scratch(hdir / "scratch.ext4")
        start(lab, host.name)
    return lab


def qemu_argv(lab: Lab, host: LabHost, vmlinuz: Path) -> list[str]:
    """QEMU's command line for ``host`` (daemonized, inside the lab's namespace)."""
    hdir = lab.host_dir(host)
    append = f"{qemu.KERNEL_ARGS} sandbench.lab={hdir / 'identity'} systemd.show_status=false"
    if setting("SANDBENCH_LAB_DEBUG"):
        append += " systemd.journald.forward_to_console=1"
    argv = [
        qemu.QEMU, "-name", host.name, "-M", "q35", "-accel", "tcg,thread=single",
        "-cpu", TCG_CPU, "-m", str(host.memory_mib), "-smp", str(VCPUS),
        "-kernel", str(vmlinuz), "-initrd", str(lab.initrd), "-append", append,
        "-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
        "-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
        "-fsdev", f"local,id=labshare,path={lab.share},security_model=none,readonly=on",
        "-device", "virtio-9p-pci,fsdev=labshare,mount_tag=labshare",
        "-drive", f"file={hdir / 'scratch.ext4'},format=raw,if=none,id=scratch,cache=writeback",
        "-device", "virtio-blk-pci,drive=scratch",
        "-netdev", f"tap,id=net0,ifname={host.tap},script=no,downscript=no",
        "-device", f"virtio-net-pci,netdev=net0,mac={host.mac}",
        "-display", "none", "-monitor", "none", "-serial", f"file:{hdir / 'console.log'}",
        "-daemonize", "-pidfile", str(hdir / "qemu.pid"),
    ]  # fmt: skip
    if host.clock_offset_s:
        now = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=host.clock_offset_s)
        argv += ["-rtc", f"base={now.strftime('%Y-%m-%dT%H:%M:%S')}"]
    return lab.in_netns(argv)


def start(lab: Lab, name: str, clock_offset_s: int | None = None) -> None:
    """Boot host ``name`` (again: after a power cut its disk is as the cut left it)."""
    host = lab.host(name)
    if lab.pid(host) is not None:
        raise LabError(f"{name} is running (pid {lab.pid(host)}): ops/lab.sh kill {name} first")
    if clock_offset_s is not None:
        host.clock_offset_s = clock_offset_s
        lab.save()
    prepared = guest.load_guest()
    if prepared is None:
        raise LabError("no prepared guest kernel: run `sandbench vm prepare` (ops/setup.sh)")
    with open(lab.host_dir(host) / "console.log", "a") as log:
        log.write(f"\n--- boot at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n")
    _sh(qemu_argv(lab, host, prepared.vmlinuz), f"booting {name}")


def kill(lab: Lab, name: str) -> None:
    """Power cut: QEMU of host ``name`` killed at once (SIGKILL); its disk stays."""
    host = lab.host(name)
    pid = lab.pid(host)
    if pid is None:
        return
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while lab.pid(host) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    (lab.host_dir(host) / "qemu.pid").unlink(missing_ok=True)


def down(directory: Path) -> None:
    """Stop every host of the lab in ``directory`` and remove the lab and its namespace."""
    netns = netns_name(directory.resolve())
    if (directory / STATE_FILE).exists():
        lab = Lab.load(directory)
        for host in lab.hosts:
            kill(lab, host.name)
        netns = lab.netns
    subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
    shutil.rmtree(directory, ignore_errors=True)


def wait_ready(lab: Lab, name: str, timeout_s: float = BOOT_TIMEOUT_S) -> str:
    """Wait until host ``name`` answers over SSH with systemd up; its system state."""
    deadline = time.monotonic() + timeout_s
    host = lab.host(name)
    while time.monotonic() < deadline:
        if lab.pid(host) is None:
            raise LabError(f"{name} stopped while booting; console: {_console_tail(lab, host)}")
        proc = subprocess.run(
            lab.ssh_argv(name, "systemctl is-system-running --wait"),
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
        state = proc.stdout.strip()
        if state in ("running", "degraded"):
            return state
        time.sleep(POLL_S)
    raise LabError(f"{name} not up within {timeout_s:g} s; console: {_console_tail(lab, host)}")


def _console_tail(lab: Lab, host: LabHost, lines: int = 8) -> str:
    """The last lines of the host's console log, on one line."""
    try:
        text = (lab.host_dir(host) / "console.log").read_text(errors="replace")
    except OSError:
        return "(no console log)"
    return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())


def build_wheels(lab: Lab, python: str = sys.executable) -> Path:
    """The wheelhouse for an offline install, in the lab's share: the command the README gives
    for a connected machine (``pip wheel`` of sandbench and its dependencies)."""
    wheels = lab.share / "wheels"
    wheels.mkdir(exist_ok=True)
    proc = subprocess.run(
        [python, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--wheel-dir",
         str(wheels), str(REPO)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise LabError(f"pip wheel failed: {proc.stderr.strip()[-800:]}")
    # the commit the wheels were built from, which install.sh records (README's command does too)
    (wheels / COMMIT_FILE).write_text(git_commit(REPO) + "\n")
    return wheels


# --- the command line ----------------------------------------------------------------------------
