"""The coordinator's side of the fleet: its tasks, verifying and storing records, lost runs.

The tasks (queue ``coordinator``) are thin adapters: ``store_record`` and ``store_provenance``
verify and store what a lab host sent; ``finalize_host`` calls
``coordinator.results.finalize``'s plain function once every environment planned for a host
(every attempt) has a stored record or a lost mark.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any, TypedDict

import redis
from celery import Celery
from cryptography.exceptions import InvalidSignature
from pydantic import ValidationError

from contract.app import (
    COORDINATOR_QUEUE,
    DEFAULT_VISIBILITY_TIMEOUT_S,
    TASK_FINALIZE,
    TASK_PROVENANCE,
    TASK_STORE,
)
from contract.broker import ALIVE_KEY, STARTED_KEY
from contract.errors import HostKeyError, RecordRejected, StoreError
from contract.outbox import Outbox, send_specs
from contract.records import EnvironmentRecord, EnvironmentSpec
from contract.signing import (
    canonical_json,
    fingerprint,
    public_key_from_b64,
    record_key,
    verify_record_data,
)
from coordinator.fleet.clocks import FleetClocks
from coordinator.fleet.leases import Leases
from coordinator.results.finalize import FinalizedJSON, finalize_host
from coordinator.store.progress import (
    LOST_FILE,
    HostProgress,
    host_progress,
    planned_hosts,
    planned_keys,
)
from coordinator.store.store import Store
from coordinator.store.trust import HostRegistry

log = logging.getLogger("sandbench.coordinator")

DEFAULT_DATA = ".data"
# Redis key templates of the coordinator.
ACTIVE_CAMPAIGNS_KEY = "sandbench:campaigns"  # set of campaign ids still being watched
REJECTED_KEY = "sandbench:rejected:{campaign}"  # list of JSON {key, host, reason}
STORED_AT_KEY = "sandbench:stored-at:{campaign}"  # hash env key -> wall time the store took it
FINALIZED_KEY = "sandbench:finalized:{campaign}"  # hash host -> fingerprint at finalization
# string -> the fingerprint a finalize_host was queued for; it expires, so a message the broker
# lost (its append-only file kept the mark written before it, not the message) is queued again
FINALIZE_QUEUED_KEY = "sandbench:finalize-queued:{campaign}:{host}"
FINALIZE_RETRY_S = 30  # seconds after which a host queued but still not finalized is queued again
REPORT_STALE_KEY = "sandbench:report-stale"  # campaigns whose report misses a finalized host
DUPLICATES_KEY = "sandbench:duplicates:{campaign}"  # hash host -> records dropped as duplicates
SWEEP_INTERVAL_S = 2.0
LOST_REASON = "lost: worker stopped mid-environment and the environment did not come back"


class Stored(TypedDict):
    """A ``store_record`` task's result: the record's key, and False for a duplicate dropped."""

    key: str
    stored: bool


class Refused(TypedDict):
    """A task's result for a record or provenance that was not stored, and why."""

    rejected: str


class ProvenanceStored(TypedDict):
    """A ``store_provenance`` task's result: whose provenance was stored."""

    provenance: str


class Rejection(TypedDict):
    """A rejection as the coordinator's Redis list keeps it (``sandbench status`` counts them)."""

    host: object  # as the rejected message named it (perhaps no host at all)
    reason: str
    at: float


def rejection(data: dict[str, Any], reason: str) -> tuple[str, str]:
    """Log a record that must not be stored; the Redis list and entry that count it."""
    campaign = str(data.get("campaign", "unknown"))
    entry = Rejection(host=data.get("host"), reason=reason, at=time.time())
    log.warning("record rejected: %s", reason)
    return REJECTED_KEY.format(campaign=campaign), json.dumps(entry)


class Coordinator:
    """Verifies, stores and finalizes; one per coordinator process."""

    def __init__(
        self,
        store: Store,
        registry: HostRegistry,
        client: redis.Redis,
        app: Celery,
        clocks: FleetClocks | None = None,
    ) -> None:
        self.store, self.registry, self.client, self.app = store, registry, client, app
        self.clocks = clocks or FleetClocks()
        self.leases = Leases(client, self.requeue, self.mark_lost, self.clocks.lease_slack_s)
        self._reported: dict[str, float] = {}  # campaign -> when the sweep last rebuilt its report

    def lost_after_s(self) -> float:
        """Seconds after its start at which a silent, unrecorded environment counts as lost."""
        transport = self.app.conf.broker_transport_options or {}
        visibility = transport.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT_S)
        return float(visibility) + self.clocks.lost_grace_s

    # --- records -------------------------------------------------------------------------------
    def check(self, data: dict[str, Any]) -> EnvironmentRecord:
        """The record ``data`` if its host signed these very fields and it was planned.

        The signature is checked over the object as it came off the wire, and the object must
        be a valid record as it stands (no coercion): what is stored is what the host signed.
        """
        if not isinstance(data, dict):
            raise RecordRejected("a record must be a JSON object")
        verify_record_data(data, self.registry)
        if data.get("superseded") is not False:  # unsigned: only the analysis derives it
            raise RecordRejected(
                f"{record_key(data)}: a record sent as superseded (a host never marks one; it "
                "would hide the result)"
            )
        record = EnvironmentRecord.model_validate(data, strict=True)
        try:
            planned = planned_keys(self.store, record.campaign)
        except StoreError as exc:
            raise RecordRejected(f"{record.key()}: {exc}") from exc
        if record.key() not in planned:
            raise RecordRejected(f"{record.key()}: no such environment was planned")
        return record

    def accept(self, data: dict[str, Any]) -> Stored | Refused:
        """Store one record from the wire if it verifies; finalize its host when complete."""
        try:
            record = self.check(data)
        except (ValidationError, RecordRejected) as exc:
            return self.reject(data if isinstance(data, dict) else {}, str(exc).splitlines()[0])
        added = self.store.append_records([record], [data]) == 1
        self.client.hset(STORED_AT_KEY.format(campaign=record.campaign), record.key(), time.time())
        if not added:  # the first record stored for a key wins; a later one is counted
            log.info("duplicate record %s dropped (already stored)", record.key())
            self.client.hincrby(DUPLICATES_KEY.format(campaign=record.campaign), record.host, 1)
        self.maybe_finalize(record.campaign, record.host)
        return Stored(key=record.key(), stored=added)

    def reject(self, data: dict[str, Any], reason: str) -> Refused:
        """Log and count a record that must not be stored."""
        self.client.rpush(*rejection(data, reason))
        return Refused(rejected=reason)

    def rejected(self, campaign: str) -> list[Rejection]:
        """Every rejection logged for ``campaign``."""
        raw = self.client.lrange(REJECTED_KEY.format(campaign=campaign), 0, -1)
        return [json.loads(x) for x in raw]

    def accept_provenance(self, envelope: dict[str, Any]) -> ProvenanceStored | Refused:
        """Store a host's signed provenance if its registered key signed it."""
        host, campaign = str(envelope.get("host")), str(envelope.get("campaign"))
        body = {"campaign": campaign, "host": host, "facts": envelope.get("facts")}
        try:
            public = self.registry.public_key(host)
            if envelope.get("key_id") != f"{host}:{fingerprint(public)}":
                raise RecordRejected(f"provenance of {host}: not signed by its registered key")
            signature = base64.b64decode(str(envelope.get("ed25519")), validate=True)
            public_key_from_b64(public).verify(signature, canonical_json(body))
            planned_keys(self.store, campaign)  # a campaign stored here
        except (HostKeyError, RecordRejected, InvalidSignature, ValueError, StoreError) as exc:
            return self.reject(dict(envelope), f"provenance of {host}: {exc or 'bad signature'}")
        facts = dict(envelope["facts"])
        earlier = self.store.provenance(campaign, host).get("modes", {})
        facts["modes"] = {**earlier, **facts.get("modes", {})}  # verdicts arrive as modes run
        self.store.write_provenance(campaign, host, facts)
        return ProvenanceStored(provenance=host)

    # --- finalization --------------------------------------------------------------------------
    def maybe_finalize(self, campaign: str, host: str, outbox: Outbox | None = None) -> bool:
        """Queue ``finalize_host`` when the host is complete and not finalized as it stands
        (through ``outbox`` when given: it goes out with the outbox's next flush)."""
        progress = host_progress(self.store, campaign, host)
        if not progress.complete():  # asked after every stored record: no Redis until complete
            return False
        fingerprint = progress.fingerprint()
        if self.client.hget(FINALIZED_KEY.format(campaign=campaign), host) == fingerprint:
            return False
        queued = FINALIZE_QUEUED_KEY.format(campaign=campaign, host=host)
        if self.client.get(queued) == fingerprint:
            return False
        self.client.set(queued, fingerprint, ex=FINALIZE_RETRY_S)  # a lost message: queued again
        if outbox is not None:
            outbox.add(TASK_FINALIZE, [campaign, host], {}, queue=COORDINATOR_QUEUE,
                       task_id=uuid.uuid4().hex, argsrepr=f"{host} {campaign}")  # fmt: skip
        else:
            self.app.send_task(
                TASK_FINALIZE,
                args=[campaign, host],
                queue=COORDINATOR_QUEUE,
                argsrepr=f"{host} {campaign}",
            )
        return True

    def finalize(self, campaign: str, host: str) -> FinalizedJSON:
        """``finalize_host``, then mark the host finalized as it stands (and the campaign done).

        The campaign's report is rebuilt by the host that completes the campaign, before it is
        marked finalized (so a finished campaign has its report); a host finalized while others
        still run marks the report stale, and the sweep rebuilds it at most every
        ``$SANDBENCH_REPORT_EVERY`` seconds: 5,000 hosts finishing cost a few rebuilds, not 5,000.
        """
        from coordinator.results.report import write_report  # the report imports what imports this

        result = finalize_host(self.store, campaign, host, report=False)
        if not result.complete:
            return result.as_dict()
        last = self.all_finalized(campaign, but=host)
        if last:
            write_report(self.store, campaign)
            self.client.srem(REPORT_STALE_KEY, campaign)
        else:
            self.client.sadd(REPORT_STALE_KEY, campaign)
        self.client.hset(FINALIZED_KEY.format(campaign=campaign), host, result.fingerprint)
        if last:
            self.client.srem(ACTIVE_CAMPAIGNS_KEY, campaign)
        return result.as_dict()

    def refresh_reports(self, now: float) -> None:
        """Rebuild the stale reports last built at least ``$SANDBENCH_REPORT_EVERY`` s ago."""
        from coordinator.results.report import write_report

        every = self.clocks.report_every_s
        for campaign in sorted(str(c) for c in self.client.smembers(REPORT_STALE_KEY)):
            if now - self._reported.get(campaign, 0.0) < every:
                continue
            self.client.srem(REPORT_STALE_KEY, campaign)  # a finalization after this marks again
            try:
                write_report(self.store, campaign)
            except StoreError as exc:
                log.warning("report of %s not rebuilt: %s", campaign, exc)
            self._reported[campaign] = now

    def all_finalized(self, campaign: str, but: str | None = None) -> bool:
        """Whether every host of ``campaign`` (``but`` one) is finalized as it stands."""
        done = self.client.hgetall(FINALIZED_KEY.format(campaign=campaign))
        hosts = [h for h in planned_hosts(self.store, campaign) if h != but]
        if any(h not in done for h in hosts):  # cheap: no host's records looked at
            return False
        return all(done[h] == host_progress(self.store, campaign, h).fingerprint() for h in hosts)

    # --- lost runs -------------------------------------------------------------------------------
    def lost_runs(self, progress: HostProgress, now: float) -> Iterable[EnvironmentSpec]:
        """Environments that started, stopped beating and did not come back in time."""
        missing = progress.missing()
        if not missing:
            return
        # one MGET per host and sweep, not a GET per missing environment (thousands queued)
        marks = self.client.mget([STARTED_KEY.format(key=s.key()) for s in missing])
        started = [(s, float(m)) for s, m in zip(missing, marks, strict=True) if m is not None]
        overdue = [s for s, at in started if now - at > self.lost_after_s()]
        if not overdue:
            return
        beats = self.client.mget([ALIVE_KEY.format(key=s.key()) for s in overdue])
        yield from (s for s, beat in zip(overdue, beats, strict=True) if beat is None)

    def mark_lost(self, campaign: str, host: str, spec: EnvironmentSpec, reason: str) -> None:
        """Record that ``spec`` was lost, with ``reason`` (a planned environment without record)."""
        path = self.store.host_dir(campaign, host) / LOST_FILE
        line = json.dumps(
            {"key": spec.key(), "task_id": spec.task_id, "reason": reason, "at": time.time()}
        )
        with open(path, "a") as f:
            f.write(line + "\n")
        log.warning("environment %s lost: %s", spec.key(), reason)

    def requeue(self, spec: EnvironmentSpec) -> None:
        """Queue ``spec`` again exactly as planned (same key, attempt and task id)."""
        send_specs(self.app, [spec], self.store.signer)

    def sweep(self) -> None:
        """One pass over the active campaigns: lost runs, expired leases, finalize what is done,
        and the stale reports due."""
        now = time.time()
        for campaign in sorted(str(c) for c in self.client.smembers(ACTIVE_CAMPAIGNS_KEY)):
            try:
                hosts = planned_hosts(self.store, campaign)
            except StoreError:
                continue
            for host in hosts:
                progress = host_progress(self.store, campaign, host)
                for spec in self.lost_runs(progress, now):
                    self.mark_lost(campaign, host, spec, LOST_REASON)
                self.leases.sweep(campaign, progress, now)
                self.maybe_finalize(campaign, host)
        self.refresh_reports(now)

    def watch(self, stop: threading.Event) -> None:
        """Sweep every few seconds until ``stop`` is set (a daemon thread of the coordinator)."""
        while not stop.wait(SWEEP_INTERVAL_S):
            try:
                self.sweep()
            except (redis.RedisError, StoreError, OSError) as exc:
                log.warning("sweep failed, retrying: %s", exc)


def register_tasks(coordinator: Coordinator) -> None:
    """Define ``coordinator``'s tasks on its app (the lab hosts' are sent by name)."""
    app = coordinator.app

    # the store is the record: no result, and no STARTED state written before each one
    @app.task(name=TASK_STORE, ignore_result=True, track_started=False)  # type: ignore[untyped-decorator]  # celery is untyped
    def store_record(record: dict[str, Any]) -> Stored | Refused:
        """Verify and store one record; finalize its host when every environment has one."""
        return coordinator.accept(record)

    @app.task(name=TASK_PROVENANCE)  # type: ignore[untyped-decorator]  # celery is untyped
    def store_provenance(envelope: dict[str, Any]) -> ProvenanceStored | Refused:
        """Verify and store one host's provenance for a campaign."""
        return coordinator.accept_provenance(envelope)

    @app.task(name=TASK_FINALIZE)  # type: ignore[untyped-decorator]  # celery is untyped
    def finalize(campaign: str, host: str) -> FinalizedJSON:
        """Re-apply the rule from the stored records and write one host's results."""
        return coordinator.finalize(campaign, host)
