"""Benchmark: messages dispatched per second for a campaign of 10,000 environments on 20 hosts.

A private redis-server with ops/redis.conf's fsync policy (``appendfsync always``); Celery's
own event receiver (what Flower runs) listens in another process. Each of ``ROUNDS`` rounds
times ``dispatch_specs`` (store the campaign, queue every environment on its host's queue) for
a fresh campaign, then checks, outside the clock, that the broker holds exactly the planned
messages: per host queue one message per planned environment, in run order, each the task
``run_environment`` with its planned task id and a spec whose coordinator signature verifies,
and one ``task-sent`` event per message. Then a sample of the last round's messages goes to a
real worker and coordinator: the oldest few of one host's queue are kept (the rest dropped) and
must come back as stored, signed records. Prints medians beside the target.

Run: .venv/bin/python benchmarks/fleet_dispatch.py
"""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.app import TASK_RUN, create_app, host_queue  # noqa: E402
from contract.records import EnvironmentSpec  # noqa: E402
from contract.spec_signing import check_spec  # noqa: E402
from coordinator.fleet.coordinator import STORED_AT_KEY  # noqa: E402
from coordinator.fleet.dispatch import dispatch_specs, send_specs, with_task_ids  # noqa: E402
from coordinator.store.store import Store  # noqa: E402
from tests.fleet_helpers import OPS_APPENDFSYNC, Fleet, wait_until  # noqa: E402

HOSTS = [f"lab-{i:02d}" for i in range(20)]  # the reference study on 20 hosts
PER_HOST = 500
ENVIRONMENTS = len(HOSTS) * PER_HOST
ROUNDS = 3
SAMPLE = 3  # messages a real worker runs
TARGET_PER_S = 5000


def specs(campaign: str, work_root: Path) -> list[EnvironmentSpec]:
    """``PER_HOST`` quick environments (native publish, one round) on each host, in run order."""
    return with_task_ids([
        EnvironmentSpec(campaign=campaign, host=h, mode="native", workload="publish",
                        env_index=i, order_index=i, scale=0.02, rounds=1, limit_s=30,
                        work_root=str(work_root))
        for h in HOSTS for i in range(PER_HOST)
    ])  # fmt: skip


def listen(url: str, ready: Any, out: Connection) -> None:
    """Count ``task-sent`` events with Celery's receiver until told to stop (child process)."""
    app = create_app(url)
    uuids: list[str] = []
    with app.connection_for_read() as conn:
        receiver = app.events.Receiver(
            conn, handlers={"task-sent": lambda e: uuids.append(e["uuid"])}
        )
        ready.set()

        def stop_when_told() -> None:  # called between waits of at most a second
            receiver.should_stop = out.poll()

        receiver.on_iteration = stop_when_told
        receiver.capture(limit=None, timeout=None, wakeup=False)
    out.send(uuids)


def queued_specs(client: Any, host: str) -> list[dict[str, Any]]:
    """The messages on ``host``'s queue, oldest first, decoded as a worker decodes them."""
    out = []
    for raw in reversed(client.lrange(host_queue(host), 0, -1)):  # LPUSH: newest at the head
        message = json.loads(raw)
        assert message["properties"]["body_encoding"] == "base64", message["properties"]
        args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        assert message["headers"]["task"] == TASK_RUN and "sent_at" in kwargs, message["headers"]
        out.append({"id": message["headers"]["id"], "spec": args[0]})
    return out


def check_queues(client: Any, planned: list[EnvironmentSpec], trusted: str) -> None:
    """Exactly the planned messages, per host in run order, each with a verified signed spec."""
    for host in HOSTS:
        mine = [s for s in planned if s.host == host]
        queued = queued_specs(client, host)
        assert len(queued) == len(mine), (host, len(queued), len(mine))
        for spec, message in zip(mine, queued, strict=True):
            got = EnvironmentSpec.model_validate(message["spec"])
            assert message["id"] == spec.task_id and got.key() == spec.key(), (message, spec)
            check_spec(got, trusted, "the benchmark's coordinator key")
    assert sum(client.llen(host_queue(h)) for h in HOSTS) == len(planned)


def run_sample(fleet: Fleet, client: Any, planned: list[EnvironmentSpec], store: Store) -> int:
    """Keep the oldest ``SAMPLE`` messages of the first host; a real worker runs them."""
    host, campaign = HOSTS[0], planned[0].campaign
    for other in HOSTS[1:]:
        client.delete(host_queue(other))
    client.ltrim(host_queue(host), -SAMPLE, -1)  # the tail is what BRPOP takes first
    fleet.register_hosts([host])
    fleet.start_coordinator()
    fleet.start_worker(host)
    key = STORED_AT_KEY.format(campaign=campaign)
    wait_until(lambda: client.hlen(key) >= SAMPLE, 120, f"{SAMPLE} records stored")
    sample = [s.key() for s in planned if s.host == host][:SAMPLE]
    stored = {r.key(): r for r in store.records(campaign, host)}
    assert sorted(stored) == sorted(sample), (sorted(stored), sample)
    assert all(r.outcome == "passed" for r in stored.values()), stored
    return len(stored)


def main() -> None:
    """Print dispatch throughput (medians of ``ROUNDS``) beside the target, and the checks."""
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        fleet = Fleet(Path(tmp), HOSTS[:1])
        fleet.redis.start()
        app = create_app(fleet.redis.url())
        client = fleet.redis.client()
        ctx = multiprocessing.get_context("spawn")
        ready, (ours, theirs) = ctx.Event(), ctx.Pipe()
        listener = ctx.Process(target=listen, args=(fleet.redis.url(), ready, theirs))
        listener.start()
        try:
            ready.wait(60)
            wait_until(lambda: client.execute_command("PUBSUB", "NUMPAT") > 0, 30, "receiver")
            store = Store(fleet.data, signer=fleet.coordinator_key)
            trusted = fleet.coordinator_key.public_b64()
            whole, alone, sent_ids = [], [], []
            work_root = fleet.hosts[HOSTS[0]].work_root
            for r in range(ROUNDS):
                queued = specs(f"c-bench-queue-{r}", work_root)
                t0 = time.perf_counter()
                send_specs(app, queued, store.signer)
                alone.append(time.perf_counter() - t0)
                check_queues(client, queued, trusted)
                client.delete(*map(host_queue, HOSTS))
                planned = specs(f"c-bench-dispatch-{r}", work_root)
                t0 = time.perf_counter()
                dispatch_specs(app, store, "", {}, planned)
                whole.append(time.perf_counter() - t0)
                check_queues(client, planned, trusted)
                if r < ROUNDS - 1:
                    client.delete(*map(host_queue, HOSTS))
                sent_ids += [str(s.task_id) for s in queued + planned]
            time.sleep(2)  # the receiver drains what Redis already published
            ours.send("stop")
            events: list[str] = ours.recv() if ours.poll(60) else []
            ran = run_sample(fleet, client, planned, store)
        finally:
            listener.join(10)
            if listener.is_alive():
                listener.terminate()
            client.close()
            app.close()
            fleet.close()
    report(whole, alone, events, sent_ids, ran)


def report(
    whole: list[float], alone: list[float], events: list[str], sent_ids: list[str], ran: int
) -> None:
    """Print the figures beside the target and what the checks found."""
    load = os.getloadavg()[0]
    rate = ENVIRONMENTS / statistics.median(whole)
    print(f"{ENVIRONMENTS} environments on {len(HOSTS)} hosts, {ROUNDS} rounds, redis "
          f"appendfsync {OPS_APPENDFSYNC} (ops/redis.conf), load average {load:.1f}")  # fmt: skip
    print(f"dispatch (store campaign + queue): median {statistics.median(whole):.2f} s, "
          f"{rate:.0f} messages/s (target >= {TARGET_PER_S}: "
          f"{'met' if rate >= TARGET_PER_S else 'MISSED'})")  # fmt: skip
    print(f"queueing alone: median {statistics.median(alone):.2f} s, "
          f"{ENVIRONMENTS / statistics.median(alone):.0f} messages/s")  # fmt: skip
    print("broker held exactly the planned messages each round (keys, run order, signed specs)")
    missing, twice = len(set(sent_ids) - set(events)), len(events) - len(set(events))
    print(f"task-sent events received by Celery's event receiver: {len(events)} of "
          f"{len(sent_ids)} ({missing} missing, {twice} twice)")  # fmt: skip
    print(
        f"sample consumed by a real worker: {ran} of {SAMPLE} environments stored as signed records"
    )


if __name__ == "__main__":
    main()
