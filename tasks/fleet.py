"""Fleet tasks and their host-side bookkeeping in Redis: leases, done marks, failure flags.

The Celery tasks are thin adapters: ``run_environment`` (queue ``host.<name>``) runs one
environment with the plain runner and signs its record; ``store_record``, ``store_provenance``
and ``finalize_host`` (queue ``coordinator``) call ``coordinator.fleet``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery, Task
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from tasks.app import COORDINATOR_QUEUE
from tasks.errors import FleetError
from tasks.records import NOT_RUN_RULE, EnvironmentRecord, EnvironmentSpec, failed_fields
from tasks.signing import HostKey, canonical_json, default_key_path, sign_record

log = logging.getLogger(__name__)

HOST_ENV = "SANDBENCH_HOST"
WORK_ROOT_ENV = "SANDBENCH_WORK_ROOT"
DEFAULT_WORK_ROOT = "/var/tmp/sandbench"

# Redis key templates (``key`` is an environment's idempotency key).
STARTED_KEY = "sandbench:started:{key}"  # set once when an attempt starts; never expires early
ALIVE_KEY = "sandbench:alive:{key}"  # refreshed while the attempt runs; gone when its worker died
DONE_KEY = "sandbench:done:{key}"  # the attempt's record was handed to the coordinator
LOST_RUNS_KEY = "sandbench:lost-runs:{key}"  # deliveries that started and were lost
PROVENANCE_KEY = "sandbench:provenance-sent:{campaign}/{host}"  # facts sent once per campaign
CELL_FAILED_KEY = "sandbench:cell-failed:{campaign}/{host}/{mode}/{workload}/{attempt}"
MARK_TTL_S = 30 * 24 * 3600
ALIVE_TTL_S = 15
ALIVE_REFRESH_S = 5
REDIS_RETRIES = 240  # with a 0.5 s cap: rides over a redis-server restart of a minute or two

TASK_RUN = "run_environment"
TASK_STORE = "store_record"
TASK_FINALIZE = "finalize_host"
TASK_PROVENANCE = "store_provenance"


def redis_client(url: str) -> redis.Redis:
    """A Redis client for the broker at ``url`` that retries through a server restart."""
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), REDIS_RETRIES)
    return redis.Redis.from_url(url, retry=retry, socket_timeout=10, decode_responses=True)


_CLIENTS: dict[tuple[int, str], redis.Redis] = {}
_KEYS: dict[str, HostKey] = {}


def process_client(url: str) -> redis.Redis:
    """This process's Redis client for ``url`` (a forked pool child gets its own)."""
    slot = (os.getpid(), url)
    if slot not in _CLIENTS:
        _CLIENTS[slot] = redis_client(url)
    return _CLIENTS[slot]


def cell_failed_key(spec: EnvironmentSpec) -> str:
    """Redis key of the first-failure flag of ``spec``'s cell in ``spec``'s attempt."""
    return CELL_FAILED_KEY.format(
        campaign=spec.campaign,
        host=spec.host,
        mode=spec.mode,
        workload=spec.workload,
        attempt=spec.attempt,
    )


def describe(spec: EnvironmentSpec) -> str:
    """How Flower shows an environment: ``lab-a staged/publish #2``."""
    suffix = f" attempt {spec.attempt}" if spec.attempt > 1 else ""
    return f"{spec.host} {spec.mode}/{spec.workload} #{spec.env_index}{suffix}"


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

    def __enter__(self) -> _Heartbeat:
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


def rule_applies(client: redis.Redis, spec: EnvironmentSpec) -> bool:
    """Whether an environment planned before ``spec`` in its cell and attempt has failed."""
    failed_at = client.get(cell_failed_key(spec))
    return failed_at is not None and int(failed_at) < spec.order_index


def mark_failed(client: redis.Redis, spec: EnvironmentSpec) -> None:
    """Raise the first-failure flag of ``spec``'s cell (the earliest failure wins)."""
    key = cell_failed_key(spec)
    if not client.set(key, spec.order_index, nx=True, ex=MARK_TTL_S):
        current = client.get(key)
        if current is not None and int(current) > spec.order_index:
            client.set(key, spec.order_index, ex=MARK_TTL_S)


def not_run_record(spec: EnvironmentSpec) -> EnvironmentRecord:
    """The record of an environment skipped under the first-failure rule."""
    return EnvironmentRecord.from_spec(spec, outcome="not-run", reason=NOT_RUN_RULE)


def run_locally(spec: EnvironmentSpec, host: str, work_root: Path) -> EnvironmentRecord:
    """Run ``spec`` on this host with the plain runner (the transport-free part)."""
    from worker.modes.base import HostInfo
    from worker.runner import run_environment

    record = run_environment(spec, host=HostInfo(name=host, work_root=work_root))
    if record is None:
        raise FleetError(f"environment {spec.key()} was stopped before it finished")
    return record


def run_guarded(spec: EnvironmentSpec, host: str, work_root: Path) -> EnvironmentRecord:
    """``run_locally``, with a harness error turned into a failed record so the campaign goes on."""
    try:
        return run_locally(spec, host, work_root)
    except Exception as exc:  # noqa: BLE001 -- any harness error must become data, not a lost run
        log.exception("environment %s: harness error", spec.key())
        detail = f"harness error on {host}: {type(exc).__name__}: {exc}"
        return EnvironmentRecord.from_spec(spec, **failed_fields("launcher-error", detail))


def host_key(host: str) -> HostKey:
    """This host's key from ``$SANDBENCH_HOME/host.key`` (created on first use)."""
    path = default_key_path()
    if str(path) not in _KEYS:
        _KEYS[str(path)] = HostKey.load_or_create(path, name=host)
    return _KEYS[str(path)]


def sign(record: EnvironmentRecord) -> EnvironmentRecord:
    """``record`` signed with this host's key."""
    return sign_record(record, host_key(record.host))


def provenance_envelope(spec: EnvironmentSpec, host: str, work_root: Path) -> dict[str, Any]:
    """This host's provenance for ``spec``'s campaign, signed with the host key."""
    from worker.provenance import collect

    facts = collect(host, work_root, campaign=spec.campaign, seed=spec.seed, cohort=spec.cohort,
                    quota=spec.quota.model_dump(mode="json"))  # fmt: skip
    body = {"campaign": spec.campaign, "host": host, "facts": facts}
    key = host_key(host)
    return {**body, "key_id": key.key_id, "ed25519": key.sign(canonical_json(body))}


def execute(client: redis.Redis, spec: EnvironmentSpec, sent_at: float | None) -> dict[str, Any]:
    """Run one delivered environment under the fleet rules; the signed record as JSON."""
    host = os.environ.get(HOST_ENV, spec.host)
    if spec.host != host:
        raise FleetError(f"environment {spec.key()} is for host {spec.host}, this is {host}")
    received = time.time()
    lost_runs = claim_attempt(client, spec)
    if lost_runs is None:
        return {"duplicate": spec.key()}
    work_root = Path(os.environ.get(WORK_ROOT_ENV, spec.work_root))
    spec = spec.model_copy(update={"work_root": str(work_root)})
    with _Heartbeat(client, spec.key()):
        started = time.time()
        if rule_applies(client, spec):
            record = not_run_record(spec)
        else:
            record = run_guarded(spec, host, work_root)
        ended = time.time()
        if record.outcome == "failed":
            mark_failed(client, spec)
    fleet = {
        "sent_at": sent_at,
        "received_at": received,
        "runner_start": started,
        "runner_end": ended,
        "lost_runs": lost_runs,
    }
    record = EnvironmentRecord.model_validate({**record.to_json_dict(), "fleet": fleet})
    return sign(record).to_json_dict()


def register_tasks(app: Celery) -> None:
    """Define the fleet's tasks on ``app``."""

    @app.task(name=TASK_RUN, bind=True)  # type: ignore[untyped-decorator]  # celery is untyped
    def run_environment(self: Task, spec: dict[str, Any], sent_at: float | None = None) -> Any:
        """Run one environment on this host and hand its signed record to the coordinator."""
        client = process_client(self.app.conf.broker_url)
        planned = EnvironmentSpec.model_validate(spec)
        payload = execute(client, planned, sent_at)
        if "duplicate" in payload:
            return payload
        self.app.send_task(
            TASK_STORE,
            args=[payload],
            queue=COORDINATOR_QUEUE,
            argsrepr=f"{payload['host']} {payload['mode']}/{payload['workload']}"
            f" #{payload['env_index']} attempt {payload['attempt']}",
        )
        key = EnvironmentRecord.model_validate(payload).key()
        client.set(DONE_KEY.format(key=key), "1", ex=MARK_TTL_S)
        send_provenance_once(self.app, client, planned)
        return {
            k: payload[k]
            for k in ("host", "mode", "workload", "env_index", "attempt", "outcome", "reason")
        }

    @app.task(name=TASK_STORE, bind=True)  # type: ignore[untyped-decorator]  # celery is untyped
    def store_record(self: Task, record: dict[str, Any]) -> dict[str, Any]:
        """Verify and store one record; finalize its host when every environment has one."""
        from coordinator.fleet import Coordinator

        return Coordinator.from_env(self.app).accept(record)

    @app.task(name=TASK_PROVENANCE, bind=True)  # type: ignore[untyped-decorator]  # celery is untyped
    def store_provenance(self: Task, envelope: dict[str, Any]) -> dict[str, Any]:
        """Verify and store one host's provenance for a campaign."""
        from coordinator.fleet import Coordinator

        return Coordinator.from_env(self.app).accept_provenance(envelope)

    @app.task(name=TASK_FINALIZE, bind=True)  # type: ignore[untyped-decorator]  # celery is untyped
    def finalize_host(self: Task, campaign: str, host: str) -> dict[str, Any]:
        """Re-apply the rule from the stored records and write one host's results."""
        from coordinator.fleet import Coordinator

        return Coordinator.from_env(self.app).finalize(campaign, host)


def send_provenance_once(app: Celery, client: redis.Redis, spec: EnvironmentSpec) -> None:
    """After a campaign's first environment on this host, send the host's provenance."""
    marker = PROVENANCE_KEY.format(campaign=spec.campaign, host=spec.host)
    if not client.set(marker, "1", nx=True, ex=MARK_TTL_S):
        return
    work_root = Path(os.environ.get(WORK_ROOT_ENV, spec.work_root))
    envelope = provenance_envelope(spec, spec.host, work_root)
    app.send_task(TASK_PROVENANCE, args=[envelope], queue=COORDINATOR_QUEUE,
                  argsrepr=f"{spec.host} {spec.campaign}")  # fmt: skip
