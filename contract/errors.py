"""The one error hierarchy of sandbench: bad input and unusable parts, never benchmark failures."""

from __future__ import annotations


def one_line(text: object) -> str:
    """``text`` as one line of plain text: every character that is not printable (newlines and
    the other line breaks ``str.splitlines`` knows, terminal escapes, other controls) written as
    its Python escape, so a name taken from a user's file cannot break or colour an error line."""
    return "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in str(text)
    )


class SandbenchError(Exception):
    """Base of every error sandbench raises on purpose; its message says what to fix."""


class PlanError(SandbenchError):
    """A plan file or plan option is wrong."""


class InvalidName(SandbenchError):
    """A campaign id, cohort, host, mode or workload name that cannot be a file or cgroup name."""


class WorkloadError(SandbenchError):
    """A workload name, scale or parameter is wrong."""


class ModeUnavailable(SandbenchError):
    """A mode is unknown or cannot run on this host."""


class RecordRejected(SandbenchError):
    """A record failed signature, schema, campaign or host checks."""


class StoreError(SandbenchError):
    """The campaign store is missing, inconsistent or would be overwritten."""


class HostKeyError(SandbenchError):
    """A host key is missing, malformed or not registered."""


class FleetError(SandbenchError):
    """The broker, a queue or a fleet task cannot be reached or found."""


class SpecRefused(SandbenchError):
    """A lab host refuses to run a spec (another host's, unsigned, or not signed by the
    coordinator key it trusts); ``reason`` is the short class ``sandbench status`` counts."""

    def __init__(self, message: str, reason: str = "refused") -> None:
        super().__init__(message)
        self.reason = reason


class CompareRefused(SandbenchError):
    """Two result sets the study's rules keep apart, or a side that does not exist."""


class QuotaError(SandbenchError):
    """The cgroup of an environment cannot be created, limited or removed."""


class V2HostError(SandbenchError):
    """The cgroup v2 host cannot be started (no prepared guest, no QEMU, bad arguments)."""


class HostCheckFailed(SandbenchError):
    """A check this command depends on failed; the message names each check and its fix."""


class LabError(SandbenchError):
    """The lab cannot be made, reached or removed (the message says what to do)."""
