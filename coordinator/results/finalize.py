"""Finalizing a host once each planned environment has an outcome: seal, rule, report.

Both transports finalize the same way, from the store (never from a Redis chord):
``finalize_host`` signs the head of the host's log with the coordinator key (so a removed tail
shows), re-applies the first-failure rule to the stored records (violations are reported, never
repaired) and rebuilds the results and the report from the raw records.
``sandbench run`` calls it when its host is done, the fleet's coordinator when a host's last
record or lost mark is stored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

import msgspec

from coordinator.results.report import Written, write_report
from coordinator.store.hostlog import LOST_FILE
from coordinator.store.policy import JudgedRecord, Violation, derive
from coordinator.store.progress import counted, fingerprint, planned_views, read_lost
from coordinator.store.store import Store
from coordinator.store.views import OUTCOME_DECODER

log = logging.getLogger("sandbench.coordinator")


class FinalizedJSON(TypedDict):
    """A ``finalize_host`` task's result: finalized (with the rule's violations) or not yet
    (with how many environments are missing)."""

    host: str
    finalized: bool
    missing: NotRequired[int]
    violations: NotRequired[list[str]]


@dataclass
class Finalized:
    """What finalizing a host found: completeness, rule violations, the report's files."""

    host: str
    complete: bool
    fingerprint: str  # what was finalized: records and lost marks counted (HostProgress)
    missing: int = 0
    violations: list[Violation] = field(default_factory=list)
    report: Written | None = None  # what write_report wrote, when it was asked to

    def as_dict(self) -> FinalizedJSON:
        """JSON form (a Celery task's result)."""
        if not self.complete:
            return FinalizedJSON(host=self.host, finalized=False, missing=self.missing)
        violations = [str(v) for v in self.violations]
        return FinalizedJSON(host=self.host, finalized=True, violations=violations)


def host_outcomes(store: Store, campaign: str, host: str) -> Sequence[JudgedRecord]:
    """``host``'s stored records as outcome views, the file read line by line (a line that is
    not a record as written sends it down the validating path, which names the line)."""
    try:
        return [OUTCOME_DECODER.decode(line) for _, _, line in store.record_lines(campaign, host)]
    except msgspec.MsgspecError:
        return store.records(campaign, host)


def finalize_host(store: Store, campaign: str, host: str, *, report: bool = True) -> Finalized:
    """Re-apply the rule to ``host``'s stored records and rebuild results and report (unless
    ``report`` is false: the fleet's coordinator rebuilds it once for hosts done together).

    It reads what it judges through fast views (``coordinator.store.views``: the identity and
    outcome fields only, decoded by msgspec, the records file streamed line by line), never
    validating 100,000 full models; ``verify`` is what checks every byte.
    """
    planned = planned_views(store, campaign, host)
    records = host_outcomes(store, campaign, host)
    keys, received = {p.key() for p in planned}, {r.key() for r in records}
    lost = read_lost(store.host_dir(campaign, host) / LOST_FILE).keys()
    seen = fingerprint(keys, received, lost)
    if not keys or counted(keys, received, lost) < len(keys):
        return Finalized(host, False, seen, missing=len(keys) - counted(keys, received, lost))
    store.seal_host(campaign, host, len(keys))  # the final head, signed
    violations = derive(records, planned)
    for v in violations:
        log.warning("campaign %s host %s: %s", campaign, host, v)
    n = len(keys)
    del planned, records, received, keys  # the report reads its own: one copy at a time
    written = write_report(store, campaign) if report else None
    log.info("campaign %s host %s finalized (%d environments)", campaign, host, n)
    return Finalized(host, True, seen, violations=violations, report=written)
