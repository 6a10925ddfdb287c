"""The broker as both sides use it: a Redis client that rides over restarts, the hosts' keys.

A lab host's worker writes these keys; the coordinator reads ``started`` and ``alive`` to tell
a lost run from a running one. ``key`` is an environment's idempotency key
(``EnvironmentSpec.key()``). Commands that change the store first ``check_broker``: a dead
broker is one line naming ``HOST:PORT`` (never the password) before anything is created.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from contract.errors import FleetError

STARTED_KEY = "sandbench:started:{key}"  # set once when an attempt starts; never expires early
ALIVE_KEY = "sandbench:alive:{key}"  # refreshed while the attempt runs; gone when its worker died
DONE_KEY = "sandbench:done:{key}"  # the attempt's record was handed to the coordinator
LOST_RUNS_KEY = "sandbench:lost-runs:{key}"  # deliveries that started and were lost
PROVENANCE_KEY = "sandbench:provenance-sent:{campaign}/{host}"  # facts sent once per campaign
CELL_FAILED_KEY = "sandbench:cell-failed:{campaign}/{host}/{mode}/{workload}/{attempt}"
HOST_ALIVE_KEY = "sandbench:host-alive:{host}"  # refreshed by a host's running worker
HOST_SEEN_KEY = "sandbench:host-seen:{host}"  # wall time of a host's worker's latest beat
# hash reason -> count of the specs a host's worker refused (nothing ran, no record)
REFUSED_KEY = "sandbench:refused:{campaign}/{host}"
COMMAND_MODE_REFUSED = "command mode not allowed"  # a REFUSED_KEY reason (not-run records)
MARK_TTL_S = 30 * 24 * 3600
HOST_ALIVE_TTL_S = 20  # a worker gone (or cut off) this long: its host is gone
HOST_ALIVE_REFRESH_S = 5
ALIVE_TTL_S = 15
ALIVE_REFRESH_S = 5
REDIS_RETRIES = 240  # with a 0.5 s cap: rides over a redis-server restart of a minute or two
DEFAULT_PORT = 6379
# dispatch, status and rerun ask the broker before they change anything: connect and PING
# each get this long (a lab broker answers in milliseconds), and a PING that times out or finds
# the broker loading its append-only file is asked once more, so a dead or silent broker is
# reported within 5 s of the command's start, interpreter start-up included.
CHECK_TIMEOUT_S = 1.5


def redis_client(url: str) -> redis.Redis:
    """A Redis client for the broker at ``url`` that retries through a server restart."""
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), REDIS_RETRIES)
    return redis.Redis.from_url(url, retry=retry, socket_timeout=10, decode_responses=True)


def host_port(url: str) -> tuple[str, int] | None:
    """Host and port of ``url`` (the default port if none); None if either is unusable."""
    try:
        parts = urlsplit(url)
        port = parts.port or DEFAULT_PORT
    except ValueError:  # a port that is not a number in range
        return None
    return (parts.hostname, port) if parts.hostname else None


def broker_address(url: str) -> str:
    """``HOST:PORT`` of the broker at ``url``: what messages may show (never the password)."""
    address = host_port(url)
    if address is None:
        return "an unusable address"
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_broker(url: str, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Return if the broker at ``url`` answers PING in time; else FleetError naming HOST:PORT."""
    where = broker_address(url)
    client = redis.Redis.from_url(
        url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, retry=Retry(NoBackoff(), 0)
    )
    try:
        try:
            client.ping()
        except (redis.TimeoutError, redis.BusyLoadingError):  # slow or loading, not dead: once more
            client.ping()
    except redis.AuthenticationError as exc:
        raise FleetError(f"broker at {where} refused the password; fix SANDBENCH_BROKER") from exc
    except (redis.RedisError, OSError) as exc:
        password = urlsplit(url).password
        reason = str(exc).replace(password, "***") if password else str(exc)
        raise FleetError(f"broker unreachable at {where} ({reason})") from exc
    finally:
        client.close()
