"""Progress of a fleet campaign per host: what ran, what failed (with task ids), what is left."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TypedDict

import redis

from contract.broker import ALIVE_KEY, REFUSED_KEY
from coordinator.fleet.coordinator import DUPLICATES_KEY, FINALIZED_KEY, REJECTED_KEY
from coordinator.fleet.leases import requeued_count
from coordinator.store.progress import HostProgress, host_progress
from coordinator.store.store import Store
from worker.presence import host_alive, host_last_seen

# every lost mark's reason starts so (coordinator.fleet.coordinator, coordinator.fleet.leases)
LOST_PREFIX = "lost: "


class FailureLine(TypedDict):
    """A failed or lost environment of a host, with the task id to rerun it by."""

    key: str
    task_id: str | None
    reason: str | None
    superseded: bool  # a later attempt of its cell was planned


class HostStatusJSON(TypedDict):
    """One host's status as ``sandbench status --json`` prints it (``HostStatus.as_dict``)."""

    host: str
    planned: int
    outcomes: dict[str, int]
    lost: int
    running: list[str]
    left: int
    finalized: bool
    failures: list[FailureLine]
    requeued: int
    duplicates: int
    refused: dict[str, int]
    worker: str


class CampaignStatus(TypedDict):
    """A campaign's status: every host's, the count of rejected records, whether all finished."""

    campaign: str
    hosts: list[HostStatusJSON]
    rejected: int
    finished: bool


@dataclass
class HostStatus:
    """One host's line of ``sandbench status``."""

    host: str
    planned: int
    outcomes: Counter[str]
    lost: int
    running: list[str]
    left: int
    finalized: bool
    failures: list[FailureLine] = field(default_factory=list)
    requeued: int = 0  # queued but never started, then queued again (coordinator.fleet.leases)
    duplicates: int = 0  # records that arrived again for a stored key and were dropped
    refused: dict[str, int] = field(default_factory=dict)  # reason -> specs its worker refused
    worker: str = "unknown"  # "alive", "gone" (seen before) or "never seen" on this broker

    def as_dict(self) -> HostStatusJSON:
        """JSON form for ``--json``."""
        return {
            "host": self.host,
            "planned": self.planned,
            "outcomes": dict(self.outcomes),
            "lost": self.lost,
            "running": self.running,
            "left": self.left,
            "finalized": self.finalized,
            "failures": self.failures,
            "requeued": self.requeued,
            "duplicates": self.duplicates,
            "refused": self.refused,
            "worker": self.worker,
        }


def _failures(progress: HostProgress) -> list[FailureLine]:
    """Failed and lost environments of one host with their task ids."""
    latest: dict[tuple[str, str, str], int] = {}
    for s in progress.planned:
        latest[s.cell()] = max(latest.get(s.cell(), 0), s.attempt)
    out: list[FailureLine] = [
        {
            "key": r.key(),
            "task_id": r.task_id,
            "reason": r.reason,
            "superseded": r.attempt < latest.get((r.host, r.mode, r.workload), 0),
        }
        for r in progress.records.values()
        if r.outcome == "failed"
    ]
    by_key = {s.key(): s for s in progress.planned}
    out += [
        {
            "key": k,
            "task_id": by_key[k].task_id,
            "reason": reason,
            "superseded": by_key[k].attempt < latest[by_key[k].cell()],
        }
        for k, reason in progress.lost.items()
        if k in by_key
    ]
    return out


def host_status(store: Store, client: redis.Redis | None, campaign: str, host: str) -> HostStatus:
    """Status of ``host`` in ``campaign`` from the store (and Redis, when reachable)."""
    progress = host_progress(store, campaign, host, parse=True)
    missing = progress.missing()
    running: list[str] = []
    finalized = False
    requeued = duplicates = 0
    refused: dict[str, int] = {}
    worker = "unknown"
    if client is not None:
        running = [s.key() for s in missing if client.exists(ALIVE_KEY.format(key=s.key()))]
        done = client.hget(FINALIZED_KEY.format(campaign=campaign), host)
        finalized = done == progress.fingerprint() and progress.complete()
        requeued = requeued_count(client, campaign, host)
        duplicates = int(client.hget(DUPLICATES_KEY.format(campaign=campaign), host) or 0)
        counts = client.hgetall(REFUSED_KEY.format(campaign=campaign, host=host))
        refused = {str(k): int(v) for k, v in sorted(counts.items())}
        worker = worker_state(client, host)
    return HostStatus(
        host=host,
        planned=len(progress.planned),
        outcomes=Counter(r.outcome for r in progress.records.values()),
        lost=len(progress.lost),
        running=running,
        left=len(missing),
        finalized=finalized,
        failures=_failures(progress),
        requeued=requeued,
        duplicates=duplicates,
        refused=refused,
        worker=worker,
    )


def worker_state(client: redis.Redis, host: str) -> str:
    """Whether ``host``'s worker beats on the broker now, did before, or was never seen."""
    if host_alive(client, host):
        return "alive"
    return "gone" if host_last_seen(client, host) is not None else "never seen"


def campaign_status(store: Store, client: redis.Redis | None, campaign: str) -> CampaignStatus:
    """Every host's status plus the rejected records of ``campaign``."""
    hosts = store.load_campaign(campaign).hosts
    statuses = [host_status(store, client, campaign, h) for h in hosts]
    rejected = client.llen(REJECTED_KEY.format(campaign=campaign)) if client is not None else 0
    return {
        "campaign": campaign,
        "hosts": [s.as_dict() for s in statuses],
        "rejected": rejected,
        "finished": all(s.finalized for s in statuses),
    }


def format_status(status: CampaignStatus) -> str:
    """The human-readable status: one line per host, then failures and rejections."""
    lines = [f"campaign {status['campaign']}"]
    for h in status["hosts"]:
        o = h["outcomes"]
        state = "finalized" if h["finalized"] else f"{h['left']} left"
        lines.append(
            f"  {h['host']}: {h['planned']} planned, {o.get('passed', 0)} passed, "
            f"{o.get('failed', 0)} failed, {o.get('not-run', 0)} not run, {h['lost']} lost, "
            f"{len(h['running'])} running, {state}"
        )
        if h["requeued"] or h["duplicates"]:
            lines.append(
                f"    {h['requeued']} queued again (never started), "
                f"{h['duplicates']} duplicate records dropped"
            )
        for reason, count in h["refused"].items():
            lines.append(f"    refused {count}: {reason} (nothing ran, no record)")
        if h["worker"] == "never seen":
            lines.append(f"    worker not seen: no 'sandbench worker --host {h['host']}' has "
                         "reached this broker")  # fmt: skip
        elif h["worker"] == "gone" and not h["finalized"]:
            lines.append("    worker gone: its host-alive key expired (stopped or cut off)")
        for f in h["failures"]:
            mark = " (superseded)" if f["superseded"] else ""
            verb, reason = "failed", str(f["reason"])
            if reason.startswith(LOST_PREFIX):
                verb, reason = "lost", reason.removeprefix(LOST_PREFIX)
            lines.append(f"    {verb} {f['key']}: {reason} task {f['task_id']}{mark}")
    if status["rejected"]:
        lines.append(f"  rejected records: {status['rejected']} (see the coordinator's log)")
    return "\n".join(lines)
