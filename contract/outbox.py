"""Task messages written as Celery's ``send_task`` writes them, a batch per Redis transaction.

``send_task`` costs about a millisecond of Python per message, and with the broker's
``appendfsync always`` every LPUSH is its own fsync. The outbox builds each message with
Celery's own ``app.amqp.as_task_v2`` and wraps it with the kombu Redis channel's own envelope
code (JSON body, base64, delivery info and tag: what a worker's consumer decodes), with the
``task-sent`` event Flower shows built by Celery's event dispatcher. A batch then goes to Redis
as one MULTI/EXEC: per queue one LPUSH of all its messages (oldest first, so a worker's BRPOP
takes them in run order) and the queue's binding as kombu declares it, then the events'
PUBLISHes. Redis appends a transaction to its log in one write, so a batch costs one fsync and
is queued whole or not at all.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import msgspec
from celery import Celery
from celery.utils.nodenames import anon_nodename

from contract.app import RECORDS_QUEUE, TASK_RUN, TASK_STORE, describe, host_queue
from contract.broker import redis_client
from contract.records import EnvironmentSpec
from contract.signing import CoordinatorKey
from contract.spec_signing import signed_spec_data

BATCH_MESSAGES = 1000  # messages per transaction (about 2 MB of LPUSH): one fsync each
SENT_EVENT = "task-sent"
ANON_EXCHANGE = ""  # Celery publishes to a direct queue through the anonymous exchange
PERSISTENT = 2  # kombu's delivery mode of task messages (task_default_delivery_mode)
PRIORITY = 0  # the default priority: its messages live in the list named like the queue
CONTENT_TYPE, CONTENT_ENCODING = "application/json", "utf-8"  # kombu's json serializer's
_encode = msgspec.json.Encoder().encode


class Outbox:
    """Task messages for named queues, built as Celery builds them and queued in batches."""

    def __init__(
        self, app: Celery, batch: int = BATCH_MESSAGES, hostname: str | None = None
    ) -> None:
        self.app, self.batch = app, batch
        self._connection = app.connection_for_write()
        self.channel: Any = self._connection.default_channel  # kombu's Redis channel
        self._events = app.events.Dispatcher(self._connection, enabled=False, hostname=hostname)
        self._client = redis_client(app.conf.broker_url)
        self._origin, self._reply_to = anon_nodename(), app.thread_oid
        self._queued: dict[str, list[str]] = defaultdict(list)
        self._published: list[tuple[str, str]] = []
        self._declared: set[str] = set()
        self.pending = 0  # messages built since the last flush
        self.sent = 0  # messages queued by flushes

    def add(
        self,
        name: str,
        args: list[Any],
        kwargs: dict[str, Any],
        *,
        queue: str,
        task_id: str,
        argsrepr: str,
        kwargsrepr: str = "",
        ignore_result: bool | None = None,
    ) -> None:
        """Build task ``name``'s message for ``queue`` (and its sent event); flush when full."""
        headers, properties, body, sent_event = self.app.amqp.as_task_v2(
            task_id, name, args, kwargs, reply_to=self._reply_to, origin=self._origin,
            create_sent_event=self.app.conf.task_send_sent_event, ignore_result=ignore_result,
            argsrepr=argsrepr, kwargsrepr=kwargsrepr,
        )  # fmt: skip
        properties.update(argsrepr=argsrepr, kwargsrepr=kwargsrepr)  # send_task passes them on
        self._queued[queue].append(
            self._envelope(body, headers, properties, PERSISTENT, ANON_EXCHANGE, queue)
        )
        if sent_event is not None:
            self._add_event(sent_event, queue)
        self.pending += 1
        if self.pending >= self.batch:
            self.flush()

    def _add_event(self, fields: dict[str, Any], queue: str) -> None:
        """Build the ``task-sent`` event of a message for ``queue``, as Celery publishes it."""
        fields.update(queue=queue, exchange=ANON_EXCHANGE, routing_key=queue)
        self.event(SENT_EVENT, fields)

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        """Build a task event (``task-received``, ...) as Celery's dispatcher publishes it; it
        goes out with the next flush."""
        event = self._events._prepare_event(kind, fields)  # noqa: SLF001 -- as Celery's own
        exchange, routing_key = self._events.exchange.name, kind.replace("-", ".")
        payload = self._envelope(
            event, self._events.headers, {}, self._events.delivery_mode, exchange, routing_key
        )
        for topic in self.channel._get_publish_topics(exchange, routing_key):  # noqa: SLF001
            self._published.append((topic, payload))

    def _envelope(
        self,
        body: Any,
        headers: dict[str, Any],
        properties: dict[str, Any],
        delivery_mode: int,
        exchange: str,
        routing_key: str,
    ) -> str:
        """The message as kombu's Redis channel stores it (what ``basic_publish`` makes).

        JSON by msgspec (several times faster than the json module kombu uses; the same
        values, so the same message once decoded).
        """
        properties = {**properties, "delivery_mode": delivery_mode}
        message = self.channel.prepare_message(
            _encode(body), PRIORITY, CONTENT_TYPE, CONTENT_ENCODING, headers, properties
        )
        self.channel._inplace_augment_message(message, exchange, routing_key)  # noqa: SLF001
        return _encode(message).decode()

    def _bind(self, pipe: Any, queue: str) -> None:
        """Declare ``queue``'s binding as kombu's ``queue_bind`` does for a direct queue."""
        channel = self.channel
        member = channel.sep.join([queue, "", queue])
        pipe.sadd(channel.keyprefix_queue % (queue,), member)
        pipe.sadd(channel.keyprefix_binding_permanent % (queue,), member)

    def flush(self, also: Callable[[Any], None] | None = None) -> int:
        """Queue every message built since the last flush in one transaction; how many.

        ``also`` adds its own commands to that transaction (a mark that must be set exactly
        when the messages are queued); events built since go with it.
        """
        if not (self.pending or self._published or also):
            return 0
        pipe = self._client.pipeline(transaction=True)
        if also is not None:
            also(pipe)
        for queue, messages in self._queued.items():
            if queue not in self._declared:
                self._bind(pipe, queue)
            pipe.lpush(queue, *messages)
        for topic, payload in self._published:
            pipe.publish(topic, payload)
        pipe.execute()
        self._declared |= self._queued.keys()
        flushed, self.pending = self.pending, 0
        self._queued.clear()
        self._published.clear()
        self.sent += flushed
        return flushed

    def close(self) -> None:
        """Release the broker connections (what is not flushed is dropped)."""
        self._client.close()
        self._connection.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if kind is None:
                self.flush()
        finally:
            self.close()


def by_host(specs: list[EnvironmentSpec]) -> dict[str, list[EnvironmentSpec]]:
    """``specs`` grouped per host, each host's list in its seeded run order."""
    out: dict[str, list[EnvironmentSpec]] = defaultdict(list)
    for spec in sorted(specs, key=lambda s: (s.host, s.order_index)):
        out[spec.host].append(spec)
    return dict(out)


def send_specs(
    app: Celery, specs: list[EnvironmentSpec], signer: CoordinatorKey, outbox: Outbox | None = None
) -> int:
    """Queue every spec, signed, on its host's queue, host by host in run order; how many.

    Each message is Celery's own ``run_environment``, written a batch per Redis transaction:
    one fsync per batch instead of one per message. A caller that sends often passes its own
    ``outbox`` (its connections stay open).
    """
    if outbox is None:
        with Outbox(app) as own:
            return send_specs(app, specs, signer, own)
    sent = outbox.sent
    for host, host_specs in by_host(specs).items():
        queue = host_queue(host)
        for spec in host_specs:
            outbox.add(
                TASK_RUN,
                [signed_spec_data(spec, signer)],
                {"sent_at": time.time()},
                queue=queue,
                task_id=spec.task_id or uuid.uuid4().hex,
                argsrepr=describe(spec),
            )
    outbox.flush()
    return outbox.sent - sent


def add_record(outbox: Outbox, record: dict[str, Any]) -> None:
    """Add a signed record's ``store_record`` message for queue ``records`` (a host's hand-over).

    Its result is not kept (the store is the record).
    """
    shown = (f"{record['host']} {record['mode']}/{record['workload']} #{record['env_index']} "
             f"attempt {record['attempt']}")  # fmt: skip
    outbox.add(TASK_STORE, [record], {}, queue=RECORDS_QUEUE, task_id=uuid.uuid4().hex,
               argsrepr=shown, kwargsrepr="{}", ignore_result=True)  # fmt: skip
