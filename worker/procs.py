"""Kill-and-reap ownership of child processes: nothing a runner starts outlives its context."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

from worker.quota import Cgroup

REAP_WAIT_S = 5.0


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
