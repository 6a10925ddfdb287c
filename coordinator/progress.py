"""Planned versus recorded environments of a host, and finalizing a host once each has an outcome.

Both transports finalize the same way, from the store (never from a Redis chord):
``finalize_host`` signs the head of the host's log with the coordinator key (so a removed tail
shows), re-applies the first-failure rule to the stored records (violations are reported, never
repaired) and rebuilds the results and the report from the raw records.
``sandbench run`` calls it when its host is done, the fleet's coordinator when a host's last
record or lost mark is stored.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.hostlog import LOST_FILE as LOST_FILE  # fleet.py reads it from here
from coordinator.policy import Violation, derive
from coordinator.store import CAMPAIGN_FILE, Campaign, Store
from tasks.records import EnvironmentRecord, EnvironmentSpec

log = logging.getLogger("sandbench.coordinator")

ENV_KEY = "{campaign}/{host}/{mode}/{workload}/{env_index}/{attempt}"  # EnvironmentRecord.key


@dataclass
class HostProgress:
    """Planned versus received environments of one host in one campaign."""

    host: str
    planned: list[EnvironmentSpec]
    received: set[str]  # keys of stored records
    lost: dict[str, str] = field(default_factory=dict)  # env key -> reason
    records: dict[str, EnvironmentRecord] = field(default_factory=dict)  # when parsed

    def missing(self) -> list[EnvironmentSpec]:
        """Planned environments with neither a record nor a lost mark, in run order."""
        done = self.received | self.lost.keys()
        return [s for s in self.planned if s.key() not in done]

    def complete(self) -> bool:
        """Whether every planned environment has an outcome."""
        return bool(self.planned) and not self.missing()

    def fingerprint(self) -> str:
        """What finalization saw: records and lost marks counted (a change means finalize again)."""
        planned = {s.key() for s in self.planned}
        return f"{len(planned & self.received)}+{len(planned & self.lost.keys())}/{len(planned)}"


_RECEIVED: dict[Path, tuple[int, set[str]]] = {}
_RECEIVED_LOCK = threading.Lock()  # the task thread and the sweep thread share the index


def received_keys(path: Path) -> set[str]:
    """Keys of the records in ``path``, reading only what was appended since the last call."""
    with _RECEIVED_LOCK:
        return _received_keys(path)


def _received_keys(path: Path) -> set[str]:
    offset, keys = _RECEIVED.get(path, (0, set()))
    size = path.stat().st_size if path.exists() else 0
    if size < offset:  # replaced: start over
        offset, keys = 0, set()
    if size > offset:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read(size - offset)
        whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
        for line in whole.splitlines():
            if line.strip():
                d = json.loads(line)  # plain JSON: a key needs no model validation
                keys.add(ENV_KEY.format(**d))
        offset += len(whole)
    _RECEIVED[path] = (offset, keys)
    return set(keys)


def read_lost(path: Path) -> dict[str, str]:
    """Lost marks of one host: environment key -> reason."""
    if not path.exists():
        return {}
    lines = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {d["key"]: d["reason"] for d in lines}


_CAMPAIGNS: dict[tuple[str, str], tuple[float, Campaign]] = {}


def load_campaign(store: Store, campaign: str) -> Campaign:
    """``store.load_campaign``, parsed again only when campaign.json changed."""
    path = store.campaign_dir(campaign) / CAMPAIGN_FILE
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        return store.load_campaign(campaign)  # raises the store's own error
    slot = (str(store.root), campaign)
    cached = _CAMPAIGNS.get(slot)
    if cached is None or cached[0] != mtime:
        cached = (mtime, store.load_campaign(campaign))
        _CAMPAIGNS[slot] = cached
    return cached[1]


def host_progress(store: Store, campaign: str, host: str, *, parse: bool = False) -> HostProgress:
    """Planned versus received environments of ``host`` in ``campaign``, from the store.

    With ``parse`` every record is parsed (for status and finalization); otherwise only the
    keys appended since the last look are read (cheap enough to run for every stored record).
    """
    planned = load_campaign(store, campaign).host_specs(host)
    path = store.records_path(campaign, host)
    records = {r.key(): r for r in store.records(campaign, host)} if parse else {}
    received = set(records) if parse else received_keys(path)
    lost = read_lost(store.host_dir(campaign, host) / LOST_FILE)
    lost = {k: v for k, v in lost.items() if k not in received}
    return HostProgress(host, planned, received, lost, records)


@dataclass
class Finalized:
    """What finalizing a host found: completeness, rule violations, the report's files."""

    host: str
    complete: bool
    fingerprint: str  # what was finalized: records and lost marks counted (HostProgress)
    missing: int = 0
    violations: list[Violation] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)  # write_report's paths and analysis

    def as_dict(self) -> dict[str, Any]:
        """JSON form (a Celery task's result)."""
        if not self.complete:
            return {"host": self.host, "finalized": False, "missing": self.missing}
        return {
            "host": self.host,
            "finalized": True,
            "violations": [str(v) for v in self.violations],
        }


def finalize_host(store: Store, campaign: str, host: str) -> Finalized:
    """Re-apply the rule to ``host``'s stored records and rebuild results and report."""
    from coordinator.report import write_report

    progress = host_progress(store, campaign, host, parse=True)
    if not progress.complete():
        missing = len(progress.missing())
        return Finalized(host, False, progress.fingerprint(), missing=missing)
    store.seal_host(campaign, host, len(progress.planned))  # the final head, signed
    violations = derive(list(progress.records.values()), progress.planned)
    for v in violations:
        log.warning("campaign %s host %s: %s", campaign, host, v)
    report = write_report(store, campaign)
    log.info(
        "campaign %s host %s finalized (%d environments)", campaign, host, len(progress.planned)
    )
    return Finalized(host, True, progress.fingerprint(), violations=violations, report=report)
