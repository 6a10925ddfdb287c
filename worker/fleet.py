"""A lab host's side of the fleet: the ``run_environment`` task and its bookkeeping in Redis.

The task is a thin adapter around ``worker.gate.run_planned``: a spec that is not signed by the
coordinator key this host trusts (``worker.config``) is refused before anything else (the task
fails with the reason, which Flower shows, and no record is made); it claims the delivery (an
environment already handed over is a duplicate; one started before and lost runs again fresh),
keeps the attempt's alive key beating while the gate runs, hands the signed record to the
coordinator's ``store_record`` task by name, and sends this host's signed provenance (with the
modes' preflight verdicts) after its first environment of a campaign and after each new
verdict. The first-failure rule's evidence is a flag per cell attempt in Redis.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Self

import redis
from celery import Celery

from contract.app import COORDINATOR_QUEUE, TASK_PROVENANCE, TASK_RUN
from contract.broker import (
    ALIVE_KEY,
    ALIVE_REFRESH_S,
    ALIVE_TTL_S,
    CELL_FAILED_KEY,
    COMMAND_MODE_REFUSED,
    DONE_KEY,
    LOST_RUNS_KEY,
    MARK_TTL_S,
    PROVENANCE_KEY,
    REFUSED_KEY,
    STARTED_KEY,
    redis_client,
)
from contract.errors import FleetError, SpecRefused
from contract.outbox import Outbox, add_record
from contract.records import (
    EnvironmentRecord,
    EnvironmentSpec,
    NotRun,
    not_run_kind,
    preflight_why,
)
from contract.signing import HostKey, canonical_json, default_key_path
from worker.config import load_allowlist, trusted_coordinator
from worker.gate import HostState, Span, admit, rule_applies, run_planned
from worker.reaper import reap_if_left

log = logging.getLogger(__name__)

# The task's result (what Flower lists) starts with this tag and the outcome, so Flower's task
# search box finds every failed measurement with one filter: ``outcome:failed``.
OUTCOME_TAG = "outcome:"
DETAIL_CHARS = 160  # of a failure's detail in the result text (the record keeps it all)


class LabWorker:
    """This lab host's worker: its name and work root (given to ``sandbench worker``) and what
    each worker process keeps: its Redis client, its outbox and the gate's view of the host.

    Built once by the command, before Celery forks its pool; a forked child opens its own
    connections on first use (a connection is never shared across a fork).
    """

    def __init__(self, app: Celery, name: str, work_root: Path | None = None) -> None:
        self.app, self.name, self.work_root = app, name, work_root
        self._pid = 0  # the process the connections below belong to
        self._connections: tuple[redis.Redis, Outbox] | None = None
        self._hosts: dict[Path, HostState] = {}

    def client(self) -> redis.Redis:
        """This process's Redis client to the broker."""
        return self._own()[0]

    def outbox(self) -> Outbox:
        """This process's outbox to the broker (the records' hand-over)."""
        return self._own()[1]

    def _own(self) -> tuple[redis.Redis, Outbox]:
        if self._connections is None or self._pid != os.getpid():  # first use in this process
            self._pid = os.getpid()
            self._connections = redis_client(str(self.app.conf.broker_url)), Outbox(self.app)
        return self._connections

    def host(self, spec: EnvironmentSpec) -> HostState:
        """The gate's state of this host for ``spec`` (its work root, else the plan's)."""
        work_root = self.work_root or Path(spec.work_root)
        if work_root not in self._hosts:
            key = HostKey.load_or_create(default_key_path(), name=self.name)
            self._hosts[work_root] = HostState(key, work_root, allowlist=load_allowlist)
        state = self._hosts[work_root]
        if state.coordinator is None:  # installed since the last spec: trusted from now on
            state.coordinator, state.coordinator_from = trusted_coordinator()
        return state


def cell_failed_key(spec: EnvironmentSpec) -> str:
    """Redis key of the first-failure flag of ``spec``'s cell in ``spec``'s attempt."""
    return CELL_FAILED_KEY.format(
        campaign=spec.campaign,
        host=spec.host,
        mode=spec.mode,
        workload=spec.workload,
        attempt=spec.attempt,
    )


class RedisFailures:
    """The rule's evidence on the broker: each cell attempt's earliest failed order index."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def failed_before(self, spec: EnvironmentSpec) -> bool:
        """Whether an environment planned before ``spec`` in its cell attempt has failed."""
        failed_at = self.client.get(cell_failed_key(spec))
        return rule_applies(None if failed_at is None else int(failed_at), spec)

    def mark_failed(self, spec: EnvironmentSpec) -> None:
        """Raise the cell's flag at ``spec``'s order index (the earliest failure wins)."""
        key = cell_failed_key(spec)
        if not self.client.set(key, spec.order_index, nx=True, ex=MARK_TTL_S):
            current = self.client.get(key)
            if current is not None and int(current) > spec.order_index:
                self.client.set(key, spec.order_index, ex=MARK_TTL_S)


class _Heartbeat:
    """Keeps an attempt's alive key fresh from a thread while the environment runs."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self._client, self._key = client, ALIVE_KEY.format(key=key)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while True:
            try:
                self._client.set(self._key, "1", ex=ALIVE_TTL_S)
            except redis.RedisError:  # the broker is restarting; the next beat retries
                log.warning("heartbeat for %s missed", self._key)
            if self._stop.wait(ALIVE_REFRESH_S):
                return

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._client.delete(self._key)


def claim_attempt(client: redis.Redis, spec: EnvironmentSpec) -> int | None:
    """How many earlier deliveries of ``spec`` were lost, or ``None`` when it is already done.

    A delivery whose environment was started before but never handed over is a redelivery
    after a lost worker: the environment runs again fresh under the same idempotency key, so
    it is still recorded exactly once (the record says how many runs were lost).
    """
    key = spec.key()
    if client.exists(DONE_KEY.format(key=key)):
        return None
    if client.set(STARTED_KEY.format(key=key), str(time.time()), nx=True, ex=MARK_TTL_S):
        return 0
    lost = int(client.incr(LOST_RUNS_KEY.format(key=key)))
    log.warning(
        "environment %s was started before and lost %d time(s); running it again", key, lost
    )
    return lost


def execute(
    worker: LabWorker, spec: EnvironmentSpec, sent_at: float | None
) -> EnvironmentRecord | None:
    """Run one delivered environment through the gate; its signed record.

    A delivery of an environment already handed over gives ``None`` (nothing runs).
    """
    host, client = worker.host(spec), worker.client()
    try:
        admit(spec, host)
    except SpecRefused as exc:
        log.error("%s (nothing ran, no record)", exc)  # noqa: TRY400 -- one line: no traceback
        count_refusal(client, spec, exc.reason)
        raise
    received = time.time()
    lost_runs = claim_attempt(client, spec)
    if lost_runs is None:
        return None

    def fleet_fields(span: Span) -> dict[str, Any]:
        timing = {"sent_at": sent_at, "received_at": received, "runner_start": span.started}
        return {"fleet": {**timing, "runner_end": span.ended, "lost_runs": lost_runs}}

    with _Heartbeat(client, spec.key()):
        record = run_planned(spec, host, RedisFailures(client), annotate=fleet_fields)
    reap_if_left(host.work_root)  # a cleanup that failed: its leftovers go before the next one
    if record is None:
        raise FleetError(f"environment {spec.key()} was stopped before it finished")
    if command_mode_refused(record):
        count_refusal(client, spec, COMMAND_MODE_REFUSED)
    return record


def command_mode_refused(record: EnvironmentRecord) -> bool:
    """Whether ``record`` is not run because this worker's allowlist refused its command mode."""
    return not_run_kind(record.outcome, record.reason) is NotRun.PREFLIGHT and preflight_why(
        record.reason
    ).startswith(f"command mode '{record.mode}' ")


def count_refusal(client: redis.Redis, spec: EnvironmentSpec, reason: str) -> None:
    """Count one refusal of ``spec`` by ``reason`` where ``sandbench status`` reads it."""
    key = REFUSED_KEY.format(campaign=spec.campaign, host=spec.host)
    try:
        pipe = client.pipeline()
        pipe.hincrby(key, reason, 1)
        pipe.expire(key, MARK_TTL_S)
        pipe.execute()
    except redis.RedisError as exc:  # the refusal itself stands; only its count is missed
        log.warning("refusal of %s not counted: %s", spec.key(), exc)


def outcome_text(record: EnvironmentRecord) -> str:
    """The task's result as Flower lists it beside its arguments (host mode/workload #i), e.g.
    ``outcome:failed task/nonzero-exit: launcher exited with status 3``.

    A view of the signed record, never the record: the store keeps that.
    """

    def clean(text: object) -> str:  # free text never carries the tag: the filter stays exact
        return " ".join(str(text).split()).replace(OUTCOME_TAG, "outcome ")

    outcome, reason = record.outcome, clean(record.reason or "")
    text = f"{OUTCOME_TAG}{outcome}"
    if outcome == "failed":
        text += f" {record.failure_class}/{reason}"
    elif outcome == "not-run":
        text += f" {reason}"
    text += " (sentinel)" if record.kind == "sentinel" else ""
    if outcome == "failed" and record.detail:
        text += f": {clean(record.detail)[:DETAIL_CHARS]}"
    elif outcome == "passed":
        task_s = sum(r.task_s for r in record.rounds)
        text += f": task time {task_s * 1000:.1f} ms, Ready {record.ready_ms or 0:.1f} ms"
    return text


def clock_against_broker(client: redis.Redis) -> dict[str, float]:
    """This host's clock minus the broker's (Redis ``TIME``), in seconds, and the round trip.

    Times are per host (every duration is a monotonic interval on one host), so an offset breaks
    nothing; the provenance names it so that a reader comparing dates across hosts knows.
    """
    before = time.time()
    seconds, micros = client.time()
    after = time.time()
    broker = seconds + micros / 1e6
    return {"offset_s": round((before + after) / 2 - broker, 3), "rtt_s": round(after - before, 4)}


def provenance_envelope(
    spec: EnvironmentSpec, host: HostState, clock: dict[str, float]
) -> dict[str, Any]:
    """This host's provenance for ``spec``'s campaign, signed with the host key."""
    from worker.provenance import collect

    facts = collect(host.name, host.work_root, campaign=spec.campaign, seed=spec.seed,
                    cohort=spec.cohort, quota=spec.quota.model_dump(mode="json"),
                    modes=host.mode_verdicts(spec.campaign))  # fmt: skip
    facts["clock_vs_broker"] = clock
    body = {"campaign": spec.campaign, "host": host.name, "facts": facts}
    return {**body, "key_id": host.key.key_id, "ed25519": host.key.sign(canonical_json(body))}


def send_provenance(worker: LabWorker, spec: EnvironmentSpec, new_verdict: bool) -> None:
    """Send the host's provenance after its first environment of a campaign and new verdicts."""
    client = worker.client()
    marker = PROVENANCE_KEY.format(campaign=spec.campaign, host=spec.host)
    if not client.set(marker, "1", nx=True, ex=MARK_TTL_S) and not new_verdict:
        return
    envelope = provenance_envelope(spec, worker.host(spec), clock_against_broker(client))
    worker.app.send_task(TASK_PROVENANCE, args=[envelope], queue=COORDINATOR_QUEUE,
                  argsrepr=f"{spec.host} {spec.campaign}")  # fmt: skip


def hand_over(worker: LabWorker, spec: EnvironmentSpec, record: EnvironmentRecord) -> None:
    """Send ``spec``'s signed record to the coordinator and mark the environment done.

    One Redis transaction, one fsync: the done mark is set exactly when the record is queued
    (on queue ``records``, which the coordinator's intake takes in batches).
    """
    outbox = worker.outbox()
    add_record(outbox, record.to_json_dict())
    done = DONE_KEY.format(key=spec.key())
    outbox.flush(also=lambda pipe: pipe.set(done, "1", ex=MARK_TTL_S))


def register_tasks(worker: LabWorker) -> None:
    """Define the lab host's task on ``worker``'s app (the coordinator's are sent by name)."""

    # no STARTED state written to the result backend before each environment (an fsync on the
    # way to the runner): Flower shows the start from the task-started event, and the lease's
    # evidence is the host's own started mark (``claim_attempt``)
    @worker.app.task(name=TASK_RUN, track_started=False)  # type: ignore[untyped-decorator]  # celery is untyped
    def run_environment(spec: dict[str, Any], sent_at: float | None = None) -> str:
        """Run one environment on this host and hand its signed record to the coordinator."""
        planned = EnvironmentSpec.model_validate(spec)
        known = len(worker.host(planned).verdicts)
        record = execute(worker, planned, sent_at)
        if record is None:
            return f"duplicate delivery of {planned.key()}: already handed over"
        hand_over(worker, planned, record)
        new_verdict = len(worker.host(planned).verdicts) > known
        send_provenance(worker, planned, new_verdict)
        return outcome_text(record)
