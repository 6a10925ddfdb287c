"""Kill-and-reap ownership of child processes: nothing a runner starts outlives its context."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import psutil

from contract.environ import inherited
from worker import ledger
from worker.cgroups import Cgroup

REAP_WAIT_S = 5.0
KILL_POLL_S = 0.02
EXIT_ABANDONED = 125  # a child whose runner vanished before the marker exits with this


def kill_process(proc: subprocess.Popen[Any], cgroup: Cgroup | None = None) -> None:
    """SIGKILL ``proc``'s cgroup (whole tree) or session, then reap ``proc``."""
    if cgroup is not None:
        cgroup.kill()
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # started with start_new_session: pgid == pid
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    proc.wait(timeout=REAP_WAIT_S)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants (a daemon not in a cgroup of ours), and reap
    what we can."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=REAP_WAIT_S)


def kill_and_wait(pid: int, wait_s: float = REAP_WAIT_S) -> bool:
    """SIGKILL ``pid`` (not our child: e.g. named by a pid file) and wait until it is gone or a
    zombie; True if it went within ``wait_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while ledger.process_start(pid) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(KILL_POLL_S)
    return True


def close_pipes(proc: subprocess.Popen[Any]) -> None:
    """Close the pipes to and from ``proc`` (ignoring a peer that already went away)."""
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


@contextlib.contextmanager
def owned_process(
    argv: Sequence[str], cgroup: Cgroup | None = None, **popen: Any
) -> Iterator[subprocess.Popen[Any]]:
    """Spawn ``argv`` in its own session (joining ``cgroup`` before exec); kill and reap on exit."""
    if cgroup is not None:
        popen["preexec_fn"] = cgroup.preexec()
    try:
        proc = subprocess.Popen(list(argv), start_new_session=True, **popen)
    finally:
        if cgroup is not None:
            cgroup.close_preexec()
    try:
        yield proc
    finally:
        kill_process(proc, cgroup)
        close_pipes(proc)


def run_owned(
    argv: Sequence[str], timeout_s: float, stdin_text: str | None = None, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """Run a short helper command to completion (text output, ``stdin_text`` on its standard
    input), killing it past ``timeout_s``."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    if stdin_text is not None:
        popen["stdin"] = subprocess.PIPE
    with owned_process(argv, text=True, **popen) as proc:
        out: str
        err: str
        try:
            out, err = proc.communicate(stdin_text, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            out, err = "", f"{argv[0]}: no exit within {timeout_s} s"
            kill_process(proc)
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


# The launcher's last step before its exec: a small shell (its exec is cheap, whatever the size
# of the harness process that forked it) says the CPU time it used before joining (``times``, a
# builtin: its first line is the shell's own user and system time), joins the cgroup, says so,
# waits for the marker, execs. bash, not dash: it can close a descriptor numbered above 9
# ({var}>&-), so the launcher inherits neither pipe.
SHIM = (
    "joined=$1 go=$2; shift 2; "
    'times >&"$joined" || exit 125; '
    'while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; '
    'printf j >&"$joined" && read -r word <&"$go" && [ "$word" = g ] || exit 125; '
    'exec {joined}>&- {go}<&- && exec "$@"'
)
SHELL = "/bin/bash"
JOIN_WAIT_S = 30.0  # the shim's start and cgroup join (ms; in v2 an RCU grace period more)
TIMES = re.compile(r"(\d+)m([\d.]+)s (\d+)m([\d.]+)s")  # bash's ``times``: user system


class Spawned(NamedTuple):
    """A launcher spawned by ``spawn_marked``."""

    proc: subprocess.Popen[Any]
    marker_ns: int  # ``time.monotonic_ns()`` right before the launcher was released to exec
    # The CPU time the launched process (the shim, then the launcher in its place) used before
    # it joined the cgroup: its start, counted in its own ``getrusage`` but in no cgroup of the
    # environment (``worker.containment``). About 1 ms on a host, tens under TCG.
    prejoin_cpu_s: float


def spawn_marked(argv: Sequence[str], cgroup: Cgroup | None = None, **popen: Any) -> Spawned:
    """Spawn ``argv`` in ``cgroup``, with the marker and the CPU time it used before joining.

    The child execs a small shell first (``SHIM``), which joins the cgroup, says so and waits;
    the marker is taken right before it is released to exec the launcher. So neither the
    cgroup migration (tens of milliseconds when the kernel waits for an RCU grace period) nor
    the teardown of a forked copy of this (large) process lands in Ready: what follows the
    marker is a small shell's ``read`` and ``exec``, the same in every transport. The caller's
    thread stays the child's parent (``PR_SET_PDEATHSIG``, as bwrap's ``--die-with-parent``
    uses, fires when the parent *thread* exits). ``start_shim`` then ``Shim.release`` is the
    same in two steps, so the shim's start and join can overlap other unmeasured work.
    """
    return start_shim(argv, cgroup, **popen).release()


class Shim:
    """A launcher's shim started (joining, or joined to, its cgroup), not released yet."""

    def __init__(self, argv: Sequence[str], cgroup: Cgroup | None, **popen: Any) -> None:
        launcher = _resolve(argv[0], popen.get("env"))
        self._joined_r, joined_w = os.pipe()
        go_r, self._go_w = os.pipe()
        procs_files = [str(path) for path in cgroup.join_paths()] if cgroup is not None else []
        shim = [SHELL, "-c", SHIM, "shim", str(joined_w), str(go_r), *procs_files, "--",
                launcher, *argv[1:]]  # fmt: skip
        try:
            self.proc = subprocess.Popen(shim, start_new_session=True, pass_fds=(joined_w, go_r),
                                         **popen)  # fmt: skip
        except BaseException:
            self._close()
            raise
        finally:
            os.close(joined_w)
            os.close(go_r)

    def release(self) -> Spawned:
        """Wait until the shim has joined, take the marker, let it exec the launcher."""
        try:
            said = _wait_joined(self._joined_r, self.proc)
            marker = time.monotonic_ns()
            os.write(self._go_w, b"g\n")
        finally:
            self._close()
        return Spawned(self.proc, marker, _own_cpu_s(said))

    def abandon(self) -> None:
        """Kill the shim unreleased (its environment will not run)."""
        self._close()  # its read of the go pipe ends: it exits without exec
        kill_process(self.proc)

    def _close(self) -> None:
        for fd in (self._joined_r, self._go_w):
            if fd >= 0:
                os.close(fd)
        self._joined_r = self._go_w = -1


def start_shim(argv: Sequence[str], cgroup: Cgroup | None = None, **popen: Any) -> Shim:
    """``spawn_marked``'s first step: the shim spawned, joining ``cgroup`` on its own."""
    return Shim(argv, cgroup, **popen)


def _resolve(program: str, env: dict[str, str] | None) -> str:
    """The launcher's path, or the ``FileNotFoundError`` ``Popen`` would have raised."""
    search = (env or inherited()).get("PATH")
    path = program if "/" in program else shutil.which(program, path=search)
    if path is None or not os.access(path, os.X_OK) or os.path.isdir(path):
        raise FileNotFoundError(errno.ENOENT, "No such executable file", program)
    return path


def _wait_joined(joined_r: int, proc: subprocess.Popen[Any]) -> str:
    """What the shim said up to its "joined" (``j``), without the ``j``; a shim that died or
    hung is the launcher's failure."""
    said = b""
    deadline = time.monotonic() + JOIN_WAIT_S
    with selectors.DefaultSelector() as selector:
        selector.register(joined_r, selectors.EVENT_READ)
        while not said.endswith(b"j"):
            ready = selector.select(max(0.0, deadline - time.monotonic()))
            chunk = os.read(joined_r, 256) if ready else b""
            if not chunk:  # timed out, or the shim closed its end without joining
                kill_process(proc)
                raise OSError(
                    f"the launcher's shim did not join the cgroup (status {proc.returncode})"
                )
            said += chunk
    return said[:-1].decode(errors="replace")


def _own_cpu_s(times: str) -> float:
    """The shell's own user + system seconds from the first line of its ``times``."""
    found = TIMES.search(times)
    if found is None:
        raise OSError(f"the launcher's shim said no CPU time: {times[:200]!r}")
    user_m, user_s, system_m, system_s = found.groups()
    return round(60 * (int(user_m) + int(system_m)) + float(user_s) + float(system_s), 6)
