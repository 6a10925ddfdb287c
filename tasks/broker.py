"""The broker as both sides use it: a Redis client that rides over restarts, the hosts' keys.

A lab host's worker writes these keys; the coordinator reads ``started`` and ``alive`` to tell
a lost run from a running one. ``key`` is an environment's idempotency key
(``EnvironmentSpec.key()``).
"""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

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


def redis_client(url: str) -> redis.Redis:
    """A Redis client for the broker at ``url`` that retries through a server restart."""
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), REDIS_RETRIES)
    return redis.Redis.from_url(url, retry=retry, socket_timeout=10, decode_responses=True)
