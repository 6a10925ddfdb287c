"""The record intake: ``store_record`` messages taken from queue ``records`` in batches.

A lab host hands each record over as a Celery ``store_record`` task message on queue
``records`` (``contract.outbox.add_record``). Run by Celery's worker machinery, each message costs
about 1.5 ms of Python and two fsynced Redis transactions (kombu's ack emulation) here, which
holds one coordinator process near 400 records per second. The intake takes up to ``BATCH``
messages at a time instead, each moved atomically into kombu's own unacked index, exactly as
kombu's Redis transport does on delivery: a coordinator that dies mid-batch gets them back on
their queue after the visibility timeout, from the restore sweep of any consumer of the broker
(as for a Celery worker that died). It verifies each record exactly as the task does
(``Coordinator.check``: host signature over the object as sent, strict schema, planned),
appends each host's records (linked into its log's chain, under the log's lock), fsyncs the
logs side by side (the file system commits concurrent fsyncs together), and only then, in one
Redis transaction, marks them stored, acknowledges them and publishes their ``task-succeeded``
events for Flower. Duplicates are dropped by the store and counted; rejections are logged and
counted, as by the task.
"""

from __future__ import annotations

import base64
import logging
import socket
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec
import redis
from pydantic import ValidationError

from contract.app import RECORDS_QUEUE, TASK_STORE
from contract.errors import RecordRejected, StoreError
from contract.outbox import Outbox
from contract.records import EnvironmentRecord
from coordinator.fleet.coordinator import DUPLICATES_KEY, STORED_AT_KEY, Coordinator, rejection
from coordinator.store.hostlog import LOST_FILE, sync_file
from coordinator.store.progress import planned_views, read_lost

log = logging.getLogger("sandbench.coordinator")
_decode = msgspec.json.Decoder().decode

BATCH = 256  # messages taken at a time
IDLE_WAIT_S = 1  # seconds: longest block on an empty queue (``stop`` is looked at in between)
SYNC_THREADS = 16  # host logs fsynced at once (the file system commits them together)
# Take up to ARGV[1] messages from the queue's tail (oldest first, as BRPOP would) and enter
# each into kombu's unacked index as kombu's QoS.append does: hash tag -> [message, exchange,
# routing key], zset tag -> delivery time. Atomic: a message is on the queue or in the index.
# A message that is not a kombu message (not JSON, no delivery tag) goes to KEYS[4], aside: it
# could never be acknowledged, and must not stop the messages behind it.
TAKE = """
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local m = redis.call('RPOP', KEYS[1])
  if not m then break end
  local ok, msg = pcall(cjson.decode, m)
  local props = ok and type(msg) == 'table' and msg['properties']
  local tag = type(props) == 'table' and props['delivery_tag']
  if type(tag) == 'string' then
    redis.call('HSET', KEYS[2], tag, '[' .. m .. ', "", "' .. KEYS[1] .. '"]')
    redis.call('ZADD', KEYS[3], ARGV[2], tag)
    out[#out + 1] = m
  else
    redis.call('RPUSH', KEYS[4], m)
  end
end
return out
"""
UNREADABLE_KEY = "sandbench:records-unreadable"  # list: what the take script set aside


@dataclass
class Taken:
    """One message of a batch: its delivery tag, task id, record (if decodable) and timing."""

    tag: str
    task_id: str
    data: dict[str, Any] | None
    record: EnvironmentRecord | None = None
    result: dict[str, Any] = field(default_factory=dict)


def decode(raw: str) -> Taken:
    """A message as kombu stores it, decoded like a worker does (protocol 2, JSON, base64)."""
    message = _decode(raw)  # msgspec: the same objects as json.loads, several times faster
    tag = message["properties"]["delivery_tag"]  # the take script made sure there is one
    headers = message.get("headers") if isinstance(message.get("headers"), dict) else {}
    task_id, data = str(headers.get("id", "")), None
    try:
        if headers.get("task") == TASK_STORE:
            args, _kwargs, _embed = _decode(base64.b64decode(message["body"]))
            data = args[0]
    except (msgspec.MsgspecError, ValueError, TypeError, KeyError, IndexError):
        data = None
    return Taken(tag, task_id, data if isinstance(data, dict) else None)


class Intake:
    """Takes, verifies, stores and acknowledges ``store_record`` messages in batches."""

    def __init__(self, coordinator: Coordinator, batch: int = BATCH) -> None:
        self.coordinator, self.batch = coordinator, batch
        self.client: redis.Redis = coordinator.client
        self.events = Outbox(coordinator.app, hostname=f"intake@{socket.gethostname()}")
        channel = self.events.channel
        self.keys = [RECORDS_QUEUE, channel.unacked_key, channel.unacked_index_key, UNREADABLE_KEY]
        self._take = self.client.register_script(TAKE)
        self._pool = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="intake-sync")
        # Hosts that may be complete and are not yet asked to finalize: a broker fault after
        # their records were stored and acknowledged leaves them here, and every turn asks again.
        self.pending: set[tuple[str, str]] = set()

    def take(self) -> list[str]:
        """Up to ``batch`` messages, each now in kombu's unacked index."""
        return list(self._take(keys=self.keys, args=[self.batch, time.time()]))

    def handle(self, raws: list[str]) -> int:
        """Verify, store and acknowledge one batch; how many records were stored."""
        started = time.time()
        taken = [decode(raw) for raw in raws]
        rejected: list[tuple[str, str]] = []
        groups: dict[tuple[str, str], list[Taken]] = defaultdict(list)
        for t in taken:
            reason = "not a store_record message with a record" if t.data is None else None
            if t.data is not None:
                try:
                    t.record = self.coordinator.check(t.data)
                except (ValidationError, RecordRejected) as exc:
                    reason = str(exc).splitlines()[0]
            if t.record is None:
                rejected.append(rejection(t.data or {}, reason or "rejected"))
                t.result = {"rejected": reason}
            else:
                groups[(t.record.campaign, t.record.host)].append(t)
        added = {host: self._append(group) for host, group in groups.items()}  # written
        logs = {self.coordinator.store.records_path(*host) for host in groups}
        list(self._pool.map(sync_file, logs))  # durable: the fsyncs run side by side
        self._commit(taken, groups, added, rejected, started)
        self.pending.update(h for h in groups if self._may_be_complete(*h))
        self.finalize_pending()
        return sum(added.values())

    def finalize_pending(self) -> None:
        """Ask every pending host to finalize (``maybe_finalize`` looks properly), then forget
        them; a broker fault on the way keeps them pending for the next turn."""
        if not self.pending:
            return
        hosts = sorted(self.pending)
        # every host is asked (a list, not a generator: any() would stop at the first)
        asked = [self.coordinator.maybe_finalize(*h, outbox=self.events) for h in hosts]
        if any(asked):
            self.events.flush()  # the finalize_host messages, in one transaction
        self.pending.difference_update(hosts)

    def _may_be_complete(self, campaign: str, host: str) -> bool:
        """Whether ``host`` may have an outcome for every planned environment (counts only: the
        log's keys as appended here, its lost marks); ``maybe_finalize`` then looks properly."""
        store = self.coordinator.store
        recorded = len(store.host_log(campaign, host).keys)
        lost = len(read_lost(store.host_dir(campaign, host) / LOST_FILE))
        return recorded + lost >= len(planned_views(store, campaign, host))

    def _append(self, group: list[Taken]) -> int:
        """Write one host's records of the batch (under its log's lock); how many were new."""
        records = [t.record for t in group if t.record is not None]
        objects = [t.data or {} for t in group]
        added = self.coordinator.store.append_records(records, objects, sync=False)
        for t in group:
            t.result = {"key": t.record.key() if t.record else None}
        return added

    def _commit(
        self,
        taken: list[Taken],
        groups: dict[tuple[str, str], list[Taken]],
        added: dict[tuple[str, str], int],
        rejected: list[tuple[str, str]],
        started: float,
    ) -> None:
        """One transaction: stored-at marks, duplicates, rejections, acknowledgements, events."""
        now = time.time()
        for t in taken:  # Flower takes a succeeded event alone (no received/started needed)
            done = {"uuid": t.task_id, "result": repr(t.result), "runtime": now - started}
            self.events.event("task-succeeded", done)

        def also(pipe: Any) -> None:
            for (campaign, host), group in groups.items():
                keys = {t.record.key(): now for t in group if t.record is not None}
                pipe.hset(STORED_AT_KEY.format(campaign=campaign), mapping=keys)
                if len(group) > added[(campaign, host)]:
                    duplicates = len(group) - added[(campaign, host)]
                    pipe.hincrby(DUPLICATES_KEY.format(campaign=campaign), host, duplicates)
                    log.info(
                        "%d duplicate records of %s dropped (already stored)", duplicates, host
                    )
            for key, entry in rejected:
                pipe.rpush(key, entry)
            tags = [t.tag for t in taken]
            pipe.zrem(self.keys[2], *tags)
            pipe.hdel(self.keys[1], *tags)

        self.events.flush(also=also)

    def wait(self) -> None:
        """Block until the queue holds a message (at most ``IDLE_WAIT_S``), taking nothing.

        BLMOVE from the queue's tail to its own tail moves nothing; it only wakes up the moment
        a message arrives: no polling while idle, no delay for the first record after a pause.
        """
        self.client.blmove(RECORDS_QUEUE, RECORDS_QUEUE, IDLE_WAIT_S, "RIGHT", "RIGHT")

    def run(self, stop: threading.Event) -> None:
        """Take and handle batches until ``stop`` is set (a thread of the coordinator)."""
        while not stop.is_set():
            try:
                self.finalize_pending()
                raws = self.take()
                if not raws:
                    self.wait()
                    continue
                self.handle(raws)
            except (redis.RedisError, StoreError, OSError) as exc:
                log.warning("intake failed, retrying (taken messages come back): %s", exc)
                stop.wait(1.0)
            except Exception:  # the intake must outlive any one batch
                log.exception("intake batch failed (its messages come back after the timeout)")
                stop.wait(1.0)
