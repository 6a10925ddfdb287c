"""Kill-and-reap ownership of child processes: nothing a runner starts outlives its context."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from worker.quota import Cgroup

REAP_WAIT_S = 5.0
SPAWN_POLL_S = 0.05
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
    argv: Sequence[str], timeout_s: float, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """Run a short helper command to completion (text output), killing it past ``timeout_s``."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    with owned_process(argv, text=True, **popen) as proc:
        out: str
        err: str
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            out, err = "", f"{argv[0]}: no exit within {timeout_s} s"
            kill_process(proc)
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def spawn_marked(
    argv: Sequence[str], cgroup: Cgroup | None = None, **popen: Any
) -> tuple[subprocess.Popen[Any], int]:
    """Spawn ``argv`` in ``cgroup`` and return it with the marker (``time.monotonic_ns()``).

    The child forks and joins the cgroup first, then waits; the marker is taken right before
    it is released to exec the launcher. So the cgroup migration (which can cost tens of
    milliseconds when the kernel must wait for an RCU grace period) never lands in Ready.
    ``Popen`` waits for the exec, so it runs in a helper thread meanwhile.
    """
    join_fds = cgroup.join_fds() if cgroup is not None else []
    joined_r, joined_w = os.pipe()
    go_r, go_w = os.pipe()

    def _join_and_wait() -> None:
        for fd in join_fds:
            os.write(fd, b"0")
        os.write(joined_w, b"j")
        if os.read(go_r, 1) != b"g":  # the runner went away: never exec unsupervised
            os._exit(EXIT_ABANDONED)

    spawned: dict[str, Any] = {}
    thread = threading.Thread(target=_popen_into, args=(spawned, argv, _join_and_wait, popen))
    try:
        thread.start()
        _wait_readable(joined_r, thread)
        marker = time.monotonic_ns()
        os.write(go_w, b"g")
        thread.join()
    finally:
        for fd in (*join_fds, joined_r, joined_w, go_r, go_w):
            os.close(fd)
    if "error" in spawned:
        raise spawned["error"]
    return spawned["proc"], marker


def _popen_into(
    spawned: dict[str, Any], argv: Sequence[str], preexec: Any, popen: dict[str, Any]
) -> None:
    """Popen in a helper thread; the process or the exception lands in ``spawned``."""
    try:
        spawned["proc"] = subprocess.Popen(
            list(argv), preexec_fn=preexec, start_new_session=True, **popen
        )
    except BaseException as exc:  # re-raised in the caller's thread
        spawned["error"] = exc


def _wait_readable(fd: int, thread: threading.Thread) -> None:
    """Wait until ``fd`` is readable or ``thread`` has finished (the spawn failed early)."""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while thread.is_alive() and not selector.select(SPAWN_POLL_S):
            pass
