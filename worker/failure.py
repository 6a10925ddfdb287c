"""How the runner names an environment's failure: its reason, and the real cause behind it."""

from __future__ import annotations

ENOSPC_MARKERS = ("No space left on device", "ENOSPC", "[Errno 28]")
LAUNCH_FAILURE_CODES = (126, 127)  # the shell's "cannot execute" and "not found"


class Failed(Exception):
    """The environment failed with ``reason`` (a key of ``REASONS``); internal to the runner."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


class Stopped(Exception):
    """The caller's stop event was set; internal to the runner."""


def os_reason(exc: BaseException, default: str = "launcher-error") -> str:
    """no-space for a full disk, ``default`` otherwise."""
    if (isinstance(exc, OSError) and exc.errno == 28) or any(m in str(exc) for m in ENOSPC_MARKERS):
        return "no-space"
    return default


def real_cause(failure: Failed, oom: bool, stderr: str) -> Failed:
    """The real cause: an OOM kill or a full disk outranks the symptom it produced."""
    if oom:
        return Failed("oom", f"OOM kill in the environment's cgroup ({failure.detail})")
    text = failure.detail + stderr
    if failure.reason != "timeout" and any(m in text for m in ENOSPC_MARKERS):
        return Failed("no-space", failure.detail)
    return failure
