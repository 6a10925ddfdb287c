"""The coordinator's clocks, read from the environment once, by ``sandbench coordinator``.

The command builds one ``FleetClocks`` and hands it to the ``Coordinator`` (and so to its
leases); nothing below the command reads these variables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from contract.errors import FleetError

# A host finalized while others still run: the campaign's report is rebuilt at most this often
# (by the sweep), not once per host; the last host's finalization rebuilds it at once.
REPORT_EVERY_ENV = "SANDBENCH_REPORT_EVERY"
DEFAULT_REPORT_EVERY_S = 30.0
# A started environment whose worker stopped beating is recorded lost only after its message
# had time to come back (visibility timeout) and run again; this is extra grace on top.
LOST_GRACE_ENV = "SANDBENCH_LOST_GRACE"
DEFAULT_LOST_GRACE_S = 600.0
# Beyond its limit an environment needs preparation (a fixture built at full scale, an image),
# cleanup and hand-over: this much per environment ahead in the queue.
LEASE_SLACK_ENV = "SANDBENCH_LEASE_SLACK"
DEFAULT_LEASE_SLACK_S = 300.0


@dataclass(frozen=True)
class FleetClocks:
    """How often the sweep rebuilds a stale report, and how long it waits before calling an
    environment lost (started and silent) or overdue (queued and never started)."""

    report_every_s: float = DEFAULT_REPORT_EVERY_S
    lost_grace_s: float = DEFAULT_LOST_GRACE_S
    lease_slack_s: float = DEFAULT_LEASE_SLACK_S

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> FleetClocks:
        """The clocks ``environ`` sets (``$SANDBENCH_REPORT_EVERY`` ...), defaults for the rest."""
        return cls(
            report_every_s=_seconds(environ, REPORT_EVERY_ENV, DEFAULT_REPORT_EVERY_S),
            lost_grace_s=_seconds(environ, LOST_GRACE_ENV, DEFAULT_LOST_GRACE_S),
            lease_slack_s=_seconds(environ, LEASE_SLACK_ENV, DEFAULT_LEASE_SLACK_S),
        )


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    """Seconds from ``environ[name]`` (unset or empty: ``default``); anything else is refused."""
    text = environ.get(name) or ""
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise FleetError(f"${name}={text!r}: give a number of seconds (0 or more), or unset it")
    return value
