"""The outbox: the same messages and events as Celery's send_task, a batch per transaction."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.app import TASK_RUN, create_app, host_queue
from contract.outbox import Outbox
from contract.records import EnvironmentSpec
from contract.signing import CoordinatorKey
from coordinator.fleet.dispatch import send_specs, with_task_ids
from tests.conftest import require_binary
from tests.fleet_helpers import RedisServer, wait_until

pytestmark = pytest.mark.fleet

# What differs between two sends of the same task by design: fresh tags, clocks, times.
VARYING = {"delivery_tag", "clock", "timestamp"}


@pytest.fixture
def server(tmp_path: Path) -> Any:
    """A private redis-server with fsync on every write, as ops/redis.conf."""
    require_binary("redis-server")
    srv = RedisServer(tmp_path / "redis", appendfsync="always")
    srv.start()
    yield srv
    srv.stop()


def decoded(raw: str) -> dict[str, Any]:
    """A stored message with its base64 body decoded and the per-send fields blanked."""
    message = json.loads(raw)
    body = json.loads(base64.b64decode(message["body"]))
    return blank({**message, "body": body})


def blank(value: Any) -> Any:
    """``value`` with every field in ``VARYING`` (at any depth) set to None."""
    if isinstance(value, dict):
        return {k: None if k in VARYING else blank(v) for k, v in value.items()}
    if isinstance(value, list):
        return [blank(v) for v in value]
    return value


def capture(client: redis.Redis, send: Any) -> tuple[list[str], dict[str, str], list[str]]:
    """What ``send()`` leaves on the broker: the queue, the binding sets and the events."""
    events = client.pubsub()
    events.psubscribe("*")
    wait_until(lambda: events.get_message(timeout=1), 5, "the subscription")
    send()
    published: list[str] = []
    while (m := events.get_message(timeout=0.5)) is not None:
        published.append(m["data"])
    events.close()
    queue = client.lrange(host_queue("lab-a"), 0, -1)
    bindings = {k: sorted(client.smembers(k)) for k in client.keys("_kombu.*")}
    client.flushall()
    return queue, bindings, published


def test_outbox_writes_what_send_task_writes(server: RedisServer) -> None:
    """A message and its task-sent event from the outbox equal send_task's, field for field."""
    app = create_app(server.url())
    client = server.client()
    args: list[Any] = [{"spec": {"campaign": "c-1", "x": 1.5}}]
    options: dict[str, Any] = {"queue": host_queue("lab-a"), "task_id": "t-1", "argsrepr": "shown"}

    def by_celery() -> None:
        app.send_task(TASK_RUN, args=args, kwargs={"sent_at": 2.5}, kwargsrepr="", **options)

    def by_outbox() -> None:
        with Outbox(app) as outbox:
            outbox.add(TASK_RUN, args, {"sent_at": 2.5}, **options)

    try:
        celery_queue, celery_bindings, celery_events = capture(client, by_celery)
        ours_queue, ours_bindings, ours_events = capture(client, by_outbox)
    finally:
        client.close()
        app.close()
    assert len(ours_queue) == len(celery_queue) == 1
    assert decoded(ours_queue[0]) == decoded(celery_queue[0])
    assert ours_bindings == celery_bindings and celery_bindings
    assert len(ours_events) == len(celery_events) == 1
    assert decoded(ours_events[0]) == decoded(celery_events[0])


def test_batches_keep_run_order_and_count(server: RedisServer) -> None:
    """Messages flushed in batches of 7 land on their queues once each, in order, oldest last."""
    app = create_app(server.url())
    client = server.client()
    sent = {"lab-a": [f"a-{i}" for i in range(25)], "lab-b": [f"b-{i}" for i in range(25)]}
    try:
        with Outbox(app, batch=7) as outbox:
            for i in range(25):  # interleaved hosts: a batch spans both queues
                for host, ids in sent.items():
                    outbox.add(TASK_RUN, [i], {}, queue=host_queue(host), task_id=ids[i],
                               argsrepr=ids[i])  # fmt: skip
            assert outbox.sent == 49 and outbox.pending == 1  # seven full batches so far
        assert outbox.sent == 50
        for host, ids in sent.items():
            queued = [
                json.loads(m)["headers"]["id"] for m in client.lrange(host_queue(host), 0, -1)
            ]
            assert list(reversed(queued)) == ids
    finally:
        client.close()
        app.close()


def test_send_specs_signs_every_spec(server: RedisServer) -> None:
    """send_specs queues each spec once on its host's queue, signed by the coordinator key."""
    from contract.spec_signing import check_spec

    app = create_app(server.url())
    client = server.client()
    key = CoordinatorKey.generate()
    specs = with_task_ids([
        EnvironmentSpec(campaign="c-1", host=h, mode="native", workload="publish", env_index=i,
                        order_index=i, work_root="/var/tmp/sandbench")
        for h in ("lab-a", "lab-b") for i in range(3)
    ])  # fmt: skip
    try:
        assert send_specs(app, specs, key) == len(specs)
        for host in ("lab-a", "lab-b"):
            raw = reversed(client.lrange(host_queue(host), 0, -1))
            bodies = [json.loads(base64.b64decode(json.loads(m)["body"]))[0][0] for m in raw]
            got = [EnvironmentSpec.model_validate(b) for b in bodies]
            assert [g.key() for g in got] == [s.key() for s in specs if s.host == host]
            for spec in got:
                check_spec(spec, key.public_b64(), "the test's key")
    finally:
        client.close()
        app.close()
