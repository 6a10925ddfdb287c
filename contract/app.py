"""The Celery app of the fleet: broker and result backend from configuration, JSON only.

Both sides build the same app and agree on the task and queue names here; each registers only
its own tasks (``worker.fleet`` on a lab host, ``coordinator.fleet.coordinator`` on the
coordinator) and sends the other's by name.

Every setting that shapes delivery is explicit here (see the design's "Celery facts"):
late acks, reject on worker loss, prefetch 1 with prefetch disabled beyond the running
task, an explicit visibility timeout, task events with ``task_send_sent_event`` so queued
environments show in Flower, and ``result_extended`` so results keep their names and args.

The broker URL comes from ``$SANDBENCH_BROKER`` (on lab hosts, the 0600 environment file),
never from a command line. ``rediss://`` is Redis over TLS: the broker's certificate is always
verified (``ssl_cert_reqs=required``, added when absent), against the system's CAs or the file
named by ``ssl_ca_certs=/path/ca.pem`` in the URL's query; kombu, Celery's result backend and
redis-py all read these query options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from celery import Celery

from contract.broker import broker_address, host_port
from contract.environ import setting
from contract.errors import FleetError
from contract.records import EnvironmentSpec

BROKER_ENV = "SANDBENCH_BROKER"
DEFAULT_BROKER = "redis://127.0.0.1:6379/0"
TLS_SCHEME = "rediss"
TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")  # query options naming files
# An environment is bounded by its limit (90 s by default) plus preparation and cleanup;
# a message unacknowledged for longer than this comes back (its worker is presumed dead).
VISIBILITY_TIMEOUT_ENV = "SANDBENCH_VISIBILITY_TIMEOUT"
DEFAULT_VISIBILITY_TIMEOUT_S = 900
# How often a consumer sweeps for unacknowledged messages whose visibility timeout passed.
RESTORE_INTERVAL_ENV = "SANDBENCH_RESTORE_INTERVAL"
DEFAULT_RESTORE_INTERVAL_S = 10
RESULT_EXPIRES_S = 7 * 24 * 3600
APP_NAME = "sandbench"
COORDINATOR_QUEUE = "coordinator"
RECORDS_QUEUE = "records"  # store_record messages: the coordinator's intake takes them in batches
HOST_QUEUE_PREFIX = "host."

# Task names: ``run_environment`` runs on queue ``host.<name>``, the others on ``coordinator``.
TASK_RUN = "run_environment"
TASK_STORE = "store_record"
TASK_PROVENANCE = "store_provenance"
TASK_FINALIZE = "finalize_host"

# A redis-server restart must not lose a record: publishing retries for about a minute.
PUBLISH_RETRY_POLICY = {
    "max_retries": 120,
    "interval_start": 0.0,
    "interval_step": 0.25,
    "interval_max": 0.5,
}


def host_queue(host: str) -> str:
    """The queue that only ``host``'s worker consumes."""
    return f"{HOST_QUEUE_PREFIX}{host}"


def describe(spec: EnvironmentSpec) -> str:
    """How Flower shows an environment: ``lab-a staged/publish #2``."""
    suffix = f" attempt {spec.attempt}" if spec.attempt > 1 else ""
    return f"{spec.host} {spec.mode}/{spec.workload} #{spec.env_index}{suffix}"


def broker_url(explicit: str | None = None) -> str:
    """The broker URL (``explicit``, else ``$SANDBENCH_BROKER``, else local Redis), checked."""
    return checked_broker_url(explicit or setting(BROKER_ENV) or DEFAULT_BROKER)


def checked_broker_url(url: str) -> str:
    """``url`` if usable as the broker's, its TLS certificate check explicit; else FleetError."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", TLS_SCHEME) or host_port(url) is None:
        raise FleetError(
            f"the broker URL (for {broker_address(url)}) is not redis://[:PASSWORD@]HOST[:PORT]/DB"
            " or rediss://... (TLS); fix SANDBENCH_BROKER"
        )
    query = dict(parse_qsl(parts.query))
    tls = [k for k in query if k.startswith("ssl_")]
    if parts.scheme != TLS_SCHEME:
        if tls:
            raise FleetError(f"broker URL option {tls[0]} needs rediss:// (TLS), not redis://")
        return url
    reqs = query.setdefault("ssl_cert_reqs", "required")
    if reqs.lower() not in ("required", "cert_required"):
        raise FleetError(
            f"broker URL ssl_cert_reqs={reqs} would send the password to whoever answers at "
            f"{broker_address(url)}; drop it and name the broker's CA: ssl_ca_certs=/path/ca.pem"
        )
    for key in (k for k in TLS_FILES if k in query):
        if not Path(query[key]).is_file():
            raise FleetError(f"broker URL {key}={query[key]}: no such file")
    return urlunsplit(parts._replace(query=urlencode(query, safe="/")))


def _env_int(name: str, default: int) -> int:
    """Integer setting ``name`` from the environment, ``default`` when unset."""
    value = setting(name)
    return int(value) if value else default


def celery_config(url: str) -> dict[str, Any]:
    """The complete Celery configuration for broker and backend ``url``."""
    return {
        "broker_url": url,
        "result_backend": url,
        "broker_transport_options": {
            "visibility_timeout": _env_int(VISIBILITY_TIMEOUT_ENV, DEFAULT_VISIBILITY_TIMEOUT_S),
            "unacked_restore_interval": _env_int(RESTORE_INTERVAL_ENV, DEFAULT_RESTORE_INTERVAL_S),
            "unacked_restore_throttle": 1,  # the interval alone sets the sweep period
        },
        "result_backend_transport_options": {
            "retry_policy": {"timeout": 60.0},
        },
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,  # a lab host waits for its broker forever
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "result_extended": True,
        "result_expires": RESULT_EXPIRES_S,
        "task_track_started": True,
        "task_send_sent_event": True,
        "worker_send_task_events": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_disable_prefetch": True,
        "task_publish_retry": True,
        "task_publish_retry_policy": PUBLISH_RETRY_POLICY,
        "task_default_queue": COORDINATOR_QUEUE,
        "worker_hijack_root_logger": False,
        "enable_utc": True,
    }


def create_app(broker: str | None = None) -> Celery:
    """A configured Celery app with no tasks registered (each side registers its own)."""
    app = Celery(APP_NAME, set_as_current=True)
    app.conf.update(celery_config(broker_url(broker)))
    return app
