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
    ``Popen`` waits for the exec, so a helper thread takes the marker and releases the child;
    the caller's thread stays the child's parent (``PR_SET_PDEATHSIG``, as bwrap's
    ``--die-with-parent`` uses, fires when the parent *thread* exits).
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

    marker: list[int] = []
    spawned = threading.Event()
    releaser = threading.Thread(target=_release, args=(joined_r, go_w, marker, spawned))
    releaser.start()
    try:
        proc = subprocess.Popen(
            list(argv), preexec_fn=_join_and_wait, start_new_session=True, **popen
        )
    finally:
        spawned.set()
        releaser.join()
        for fd in (*join_fds, joined_r, joined_w, go_r, go_w):
            os.close(fd)
    return proc, marker[0]


def _release(joined_r: int, go_w: int, marker: list[int], spawned: threading.Event) -> None:
    """Wait for the child's "joined", take the marker, let the child exec."""
    with selectors.DefaultSelector() as selector:
        selector.register(joined_r, selectors.EVENT_READ)
        while not selector.select(SPAWN_POLL_S):
            if spawned.is_set():  # Popen failed before the child could join
                return
    marker.append(time.monotonic_ns())
    os.write(go_w, b"g")
