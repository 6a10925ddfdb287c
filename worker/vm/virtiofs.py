"""virtiofsd, the host side of a virtio-fs workspace: its command line, its version, its lock file
and the launcher's steps that start it before QEMU and wait for it after QEMU.

The daemon is QEMU 7.2's C virtiofsd (Debian 12 ships it in qemu-system-common). It is started
by the launcher, a child of its shell, so it runs in the environment's cgroup (its CPU time and
memory count against the quota), its start lies inside Ready like the guest's boot, and the
runner's kill of the launcher's tree and cgroup ends it. It listens on a socket in the
environment's directory, named relative to it (``sun_path`` holds only 108 bytes), and keeps a
lock file named after that path in ``/run/virtiofsd``, which survives the daemon: the mode's
cleanup and the reaper remove it.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
from pathlib import Path

VIRTIOFSD = "/usr/lib/qemu/virtiofsd"
PACKAGE = "qemu-system-common"  # Debian's package of the C virtiofsd (with qemu-system-x86)
LOCK_DIR = Path("/run/virtiofsd")  # $localstatedir/run/virtiofsd, compiled into the daemon
SOCKET_PREFIX = "virtiofs-"
# The daemon's defaults, spelled out so the command line says what ran: requests are served on
# the virtqueue's own thread (no pool, the C daemon's default), the namespace sandbox
# (mount, pid and net namespaces with pivot_root into the workspace) as the daemon's default.
THREAD_POOL_SIZE = 0
SANDBOX = "namespace"
SOCKET_POLL_S = "0.002"  # the daemon makes its socket ~10 ms after its exec
EXIT_POLLS = 100  # after QEMU: ~1 s for the daemon to see its client go before it is ended
NO_DAEMON_STATUS = 126  # the launcher's "cannot execute": the runner's launcher-error


def binary() -> str | None:
    """Path of virtiofsd, or None when it is not installed (or not executable)."""
    return VIRTIOFSD if os.access(VIRTIOFSD, os.X_OK) else None


@functools.cache
def version() -> str:
    """virtiofsd's version (e.g. ``7.2.22``), or empty when it is missing."""
    if binary() is None:
        return ""
    proc = subprocess.run(
        [VIRTIOFSD, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    match = re.search(r"version (\S+)", proc.stdout + proc.stderr)
    return match.group(1) if match else ""


def socket_name(env_name: str) -> str:
    """The vhost-user socket of environment ``env_name``, relative to its directory (and unique
    among environments, since the daemon's lock file is named after it)."""
    return f"{SOCKET_PREFIX}{env_name}.sock"


def lock_file(socket: str) -> Path:
    """The lock (pid) file the daemon keeps for ``socket``, the path as given to it."""
    return LOCK_DIR / f"{socket.replace('/', '.')}.pid"


def daemon_argv(socket: str, source: Path, cache: str, writeback: bool = False) -> list[str]:
    """The virtiofsd command line serving ``source`` with cache mode ``cache`` on ``socket``
    (``writeback``: the guest's page cache holds writes until it writes them back)."""
    return [
        VIRTIOFSD, f"--socket-path={socket}", "-o", f"source={source}", "-o", f"cache={cache}",
        *(["-o", "writeback"] if writeback else []),
        "-o", f"sandbox={SANDBOX}", f"--thread-pool-size={THREAD_POOL_SIZE}",
        "-o", "log_level=warn",  # stderr is the launcher's: only what went wrong
    ]  # fmt: skip


def start_step(argv: list[str], socket: str) -> str:
    """Shell text: start the daemon in the background, wait for its socket (QEMU connects to it
    at start); a daemon that exits first makes the launcher exit ``NO_DAEMON_STATUS``."""
    sock = shlex.quote(socket)
    return f"""{shlex.join(argv)} &
vfsd=$!
until [ -S {sock} ]; do
  if ! kill -0 "$vfsd" 2>/dev/null; then
    wait "$vfsd"; echo "sandbench-vm: virtiofsd exited (status $?) before its socket" >&2
    exit {NO_DAEMON_STATUS}
  fi
  sleep {SOCKET_POLL_S}
done
"""


# After QEMU: the daemon exits when its client disconnects; one QEMU never reached is ended.
# Waited for, so the launcher leaves nothing running when it exits.
STOP_STEP = f"""i=0
while kill -0 "$vfsd" 2>/dev/null && [ "$i" -lt {EXIT_POLLS} ]; do sleep 0.01; i=$((i + 1)); done
kill "$vfsd" 2>/dev/null
wait "$vfsd"
"""
