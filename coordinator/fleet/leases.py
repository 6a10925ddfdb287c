"""Leases of queued environments: one queued but never started is queued again once, or lost.

A message can vanish from a host's queue without ever starting (deleted by hand, a broker that
lost it, a queue purged). The coordinator's sweep notices: a host works through its queue one
environment at a time in run order, so the unstarted environment at position ``p`` (0 for the
first unstarted one in run order) must have started within ``(p + 1) * (limit_s + slack)``
seconds of the host's last sign of progress (an environment started or a record stored) or
of its own queueing again, whichever is later. Past that bound it is

* queued again, once, with the same spec (same key, attempt and task id), when a worker of its
  host is alive (its host-alive key, ``worker.presence``): a copy that turns out not to be
  needed is a duplicate delivery, dropped by the worker (the key is done) or by the store;
* marked lost, with a reason, when no worker of the host is alive, or when the copy queued
  again did not start within the bound either.

A lost mark is provisional: a record that arrives later supersedes it. The clock of a host
starts when this coordinator process first sees the host's progress, so a restarted coordinator
gives every host a fresh bound rather than a stale one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import redis

from contract.broker import STARTED_KEY
from contract.records import EnvironmentSpec
from coordinator.store.progress import HostProgress
from worker.presence import host_alive

log = logging.getLogger("sandbench.coordinator")

REQUEUED_KEY = "sandbench:requeued:{campaign}"  # hash env key -> wall time it was queued again
GONE_REASON = "lost: queued but never started, and no worker of host {host} is alive"
REQUEUE_FAILED_REASON = "lost: queued, queued again once, and never started"

Requeue = Callable[[EnvironmentSpec], None]
MarkLost = Callable[[str, str, EnvironmentSpec, str], None]


def lease_s(spec: EnvironmentSpec, position: int, slack_s: float) -> float:
    """How long after the host's last progress the unstarted ``spec`` at ``position`` may wait
    (``slack_s`` per environment beyond its limit: ``FleetClocks.lease_slack_s``)."""
    return (position + 1) * (spec.limit_s + slack_s)


@dataclass
class _Clock:
    """A host's last sign of progress as this coordinator saw it."""

    seen: tuple[int, int]  # records stored, started-but-unrecorded environments
    since: float


class Leases:
    """The lease sweep over queued environments (one per coordinator process)."""

    def __init__(
        self, client: redis.Redis, requeue: Requeue, mark_lost: MarkLost, slack_s: float
    ) -> None:
        self.client, self.requeue, self.mark_lost = client, requeue, mark_lost
        self.slack_s = slack_s
        self._clocks: dict[tuple[str, str], _Clock] = {}

    def unstarted(self, progress: HostProgress) -> tuple[list[EnvironmentSpec], int]:
        """The host's missing environments that never started (run order), and how many did."""
        missing = progress.missing()
        if not missing:
            return [], 0
        marks = self.client.mget([STARTED_KEY.format(key=s.key()) for s in missing])
        never = [s for s, mark in zip(missing, marks, strict=True) if mark is None]
        return never, len(missing) - len(never)

    def progress_since(
        self, campaign: str, progress: HostProgress, started: int, now: float
    ) -> float:
        """When the host last made progress (records, starts), as seen from here.

        Lost marks are the coordinator's own verdicts, not the host's progress: a host that is
        gone does not get a fresh bound from each environment marked lost.
        """
        seen = (len(progress.received), started)
        clock = self._clocks.get((campaign, progress.host))
        if clock is None or clock.seen != seen:
            clock = self._clocks[(campaign, progress.host)] = _Clock(seen, now)
        return clock.since

    def sweep(self, campaign: str, progress: HostProgress, now: float) -> int:
        """Queue again or mark lost every overdue unstarted environment; how many were handled."""
        never, started = self.unstarted(progress)
        since = self.progress_since(campaign, progress, started, now)
        if not never:
            return 0
        requeued = self.client.hgetall(REQUEUED_KEY.format(campaign=campaign))
        alive: bool | None = None
        handled = 0
        for position, spec in enumerate(never):
            again = requeued.get(spec.key())
            if now - max(since, float(again or 0)) <= lease_s(spec, position, self.slack_s):
                continue
            alive = host_alive(self.client, progress.host) if alive is None else alive
            handled += 1
            if again is not None:
                self.mark_lost(campaign, progress.host, spec, REQUEUE_FAILED_REASON)
            elif not alive:
                self.mark_lost(campaign, progress.host, spec, GONE_REASON.format(host=spec.host))
            else:
                self.requeue(spec)
                self.client.hset(REQUEUED_KEY.format(campaign=campaign), spec.key(), now)
                log.warning("environment %s queued but never started: queued again", spec.key())
        return handled


def requeued_count(client: redis.Redis, campaign: str, host: str) -> int:
    """How many environments of ``host`` in ``campaign`` were queued again (for ``status``)."""
    keys = client.hkeys(REQUEUED_KEY.format(campaign=campaign))
    return sum(1 for k in keys if str(k).split("/")[1] == host)
