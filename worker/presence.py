"""A lab host's presence on the broker: a host-alive key its worker keeps fresh while it runs.

The coordinator reads the key when an environment queued for the host never started: with the
key present the host is up and the environment is queued again; without it the host is gone
and the environment is marked lost (``coordinator.fleet.leases``). The key is written from the
worker's own event loop (a bootstep's timer in the main process, not a thread), so it stops
when the worker stops, dies or is cut off from the broker.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, ClassVar

import redis
from celery import Celery, bootsteps

from contract.broker import (
    HOST_ALIVE_KEY,
    HOST_ALIVE_REFRESH_S,
    HOST_ALIVE_TTL_S,
    HOST_SEEN_KEY,
    MARK_TTL_S,
)

log = logging.getLogger(__name__)

BEAT_TIMEOUT_S = 2.0  # one beat never blocks the worker's event loop longer than this


def presence_step(host: str) -> type[bootsteps.StartStopStep]:
    """A worker bootstep that keeps ``host``'s alive key fresh while the worker runs."""

    class Presence(bootsteps.StartStopStep):  # type: ignore[misc]  # celery is untyped
        """Sets the host-alive key now and every few seconds; deletes it on a clean stop."""

        requires: ClassVar[set[str]] = {"celery.worker.components:Timer"}

        def __init__(self, parent: Any, **kwargs: Any) -> None:
            super().__init__(parent, **kwargs)
            self.key = HOST_ALIVE_KEY.format(host=host)
            self.seen_key = HOST_SEEN_KEY.format(host=host)
            self.client: redis.Redis | None = None
            self.tref: Any = None

        def start(self, parent: Any) -> None:
            self.client = redis.Redis.from_url(
                parent.app.conf.broker_url, socket_timeout=BEAT_TIMEOUT_S,
                socket_connect_timeout=BEAT_TIMEOUT_S, decode_responses=True,
            )  # fmt: skip
            self.beat()
            self.tref = parent.timer.call_repeatedly(HOST_ALIVE_REFRESH_S, self.beat)

        def beat(self) -> None:
            assert self.client is not None
            try:
                pipe = self.client.pipeline()
                pipe.set(self.key, "1", ex=HOST_ALIVE_TTL_S)
                pipe.set(self.seen_key, str(time.time()), ex=MARK_TTL_S)
                pipe.execute()
            except redis.RedisError as exc:  # the broker restarts or is unreachable: next beat
                log.warning("host-alive beat missed: %s", exc)

        def stop(self, parent: Any) -> None:
            if self.tref is not None:
                self.tref.cancel()
            if self.client is not None:
                with contextlib.suppress(redis.RedisError):  # else it expires by itself
                    self.client.delete(self.key)
                self.client.close()

    return Presence


def add_presence(app: Celery, host: str) -> None:
    """Make ``app``'s worker keep ``host``'s alive key fresh."""
    app.steps["worker"].add(presence_step(host))


def host_alive(client: redis.Redis, host: str) -> bool:
    """Whether a worker of ``host`` refreshed its alive key recently."""
    return bool(client.exists(HOST_ALIVE_KEY.format(host=host)))


def host_last_seen(client: redis.Redis, host: str) -> float | None:
    """Wall time of ``host``'s worker's latest beat on this broker; None if never seen."""
    seen = client.get(HOST_SEEN_KEY.format(host=host))
    return None if seen is None else float(seen)
