"""The record intake: batches from queue records stored, acknowledged, shown; nothing lost."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.app import COORDINATOR_QUEUE, RECORDS_QUEUE, TASK_FINALIZE, create_app
from contract.errors import FleetError
from contract.outbox import Outbox, add_record
from contract.records import EnvironmentRecord, EnvironmentSpec
from contract.signing import CoordinatorKey, HostKey, sign_record
from coordinator.fleet.clocks import REPORT_EVERY_ENV, FleetClocks
from coordinator.fleet.coordinator import (
    DUPLICATES_KEY,
    REJECTED_KEY,
    REPORT_STALE_KEY,
    STORED_AT_KEY,
    Coordinator,
)
from coordinator.fleet.dispatch import with_task_ids
from coordinator.fleet.intake import UNREADABLE_KEY, Intake
from coordinator.store.store import Store
from coordinator.store.trust import HostRegistry
from tests.conftest import require_binary
from tests.fleet_helpers import RedisServer, wait_until

pytestmark = pytest.mark.fleet

CAMPAIGN = "c-intake"
HOSTS = ("lab-a", "lab-b", "lab-c")


class Lab:
    """A broker, a store with a two-environment campaign per host, and the hosts' keys."""

    def __init__(self, root: Path, visibility_s: int | None = None) -> None:
        self.server = RedisServer(root / "redis")
        self.server.start()
        self.app = create_app(self.server.url())
        if visibility_s is not None:
            self.app.conf.broker_transport_options = {"visibility_timeout": visibility_s}
        self.client = redis.Redis.from_url(self.server.url(), decode_responses=True)
        self.keys = {h: HostKey.generate(h) for h in HOSTS}
        registry = HostRegistry(root / "hosts.json")
        for host, key in self.keys.items():
            registry.add(host, key.public_b64())
        self.store = Store(root / "data", signer=CoordinatorKey.generate())
        self.specs = with_task_ids([
            EnvironmentSpec(campaign=CAMPAIGN, host=h, mode="native", workload="publish",
                            env_index=i, order_index=i, work_root="/var/tmp/sandbench")
            for h in HOSTS for i in range(2)
        ])  # fmt: skip
        self.store.create_campaign("", {}, self.specs)
        self.coordinator = Coordinator(self.store, registry, self.client, self.app)

    def record(self, spec: EnvironmentSpec) -> dict[str, Any]:
        """A passed record of ``spec``, signed by its host."""
        record = EnvironmentRecord.from_spec(spec, outcome="passed", ready_ms=12.5, exit_code=0)
        return sign_record(record, self.keys[spec.host]).to_json_dict()

    def hand_over(self, records: list[dict[str, Any]]) -> list[str]:
        """Queue ``records`` as lab hosts hand them over; the messages' task ids."""
        with Outbox(self.app) as outbox:
            for record in records:
                add_record(outbox, record)
        raw = reversed(self.client.lrange(RECORDS_QUEUE, 0, -1))
        return [json.loads(m)["headers"]["id"] for m in raw]

    def close(self) -> None:
        """Stop everything started here."""
        self.client.close()
        self.app.close()
        self.server.stop()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """A ``Lab`` with fsync on every write, as ops/redis.conf."""
    require_binary("redis-server")
    made = Lab(tmp_path)
    yield made
    made.close()


def test_a_batch_is_stored_acknowledged_shown_and_finalized(lab: Lab) -> None:
    """One batch: every record stored and chained, the messages acknowledged, a task-succeeded
    event each for Flower, and each complete host's finalize_host queued."""
    events = lab.client.pubsub()
    events.psubscribe("*")
    wait_until(lambda: events.get_message(timeout=1), 5, "the subscription")
    ids = lab.hand_over([lab.record(s) for s in lab.specs])
    intake = Intake(lab.coordinator)
    assert intake.handle(intake.take()) == len(lab.specs)
    for host in HOSTS:
        stored = lab.store.records(CAMPAIGN, host)
        assert [r.key() for r in stored] == [s.key() for s in lab.specs if s.host == host]
    assert lab.client.hlen(STORED_AT_KEY.format(campaign=CAMPAIGN)) == len(lab.specs)
    assert lab.client.llen(RECORDS_QUEUE) == 0
    assert lab.client.hlen("unacked") == 0 and lab.client.zcard("unacked_index") == 0
    succeeded = []
    while (m := events.get_message(timeout=0.5)) is not None:
        if m["channel"].endswith("task.succeeded"):
            succeeded.append(json.loads(base64.b64decode(json.loads(m["data"])["body"])))
    events.close()
    assert sorted(e["uuid"] for e in succeeded) == sorted(ids)
    finalize = [json.loads(m)["headers"] for m in lab.client.lrange(COORDINATOR_QUEUE, 0, -1)]
    assert sorted(h["argsrepr"].split()[0] for h in finalize) == sorted(HOSTS)
    assert {h["task"] for h in finalize} == {TASK_FINALIZE}


def test_forged_junk_and_duplicates_are_counted_not_stored(lab: Lab) -> None:
    """A record changed after signing and a message that is no record are rejected and
    counted, one that is not even a message is set aside; a record sent twice is stored once and
    counted as a duplicate."""
    good = lab.record(lab.specs[0])
    forged = lab.record(lab.specs[1])
    forged["ready_ms"] = 99.0  # one signed field changed
    lab.hand_over([good, forged, good])
    with Outbox(lab.app) as outbox:  # a message of another task on the records queue
        outbox.add("not_a_record", [1], {}, queue=RECORDS_QUEUE, task_id="junk", argsrepr="x")
    lab.client.lpush(RECORDS_QUEUE, "not even JSON")  # no delivery tag: set aside, not retried
    intake = Intake(lab.coordinator)
    intake.handle(intake.take())
    assert lab.client.lrange(UNREADABLE_KEY, 0, -1) == ["not even JSON"]
    assert [r.key() for r in lab.store.records(CAMPAIGN, "lab-a")] == [lab.specs[0].key()]
    reasons = [json.loads(e)["reason"] for e in lab.client.lrange(REJECTED_KEY.format(
        campaign=CAMPAIGN), 0, -1)]  # fmt: skip
    assert any("bad signature" in r for r in reasons), reasons
    assert json.loads(lab.client.lrange(REJECTED_KEY.format(campaign="unknown"), 0, -1)[0])
    assert lab.client.hget(DUPLICATES_KEY.format(campaign=CAMPAIGN), "lab-a") == "1"
    assert lab.client.hlen("unacked") == 0


def test_a_batch_taken_and_never_handled_comes_back(tmp_path: Path) -> None:
    """Messages taken by an intake that dies before storing them are in kombu's unacked index;
    kombu's own restore puts them back on their queue after the visibility timeout, and the
    next intake stores each once."""
    require_binary("redis-server")
    lab = Lab(tmp_path, visibility_s=1)
    try:
        lab.hand_over([lab.record(s) for s in lab.specs])
        taken = Intake(lab.coordinator).take()  # and then the process "dies"
        assert len(taken) == len(lab.specs) and lab.client.llen(RECORDS_QUEUE) == 0
        assert lab.client.hlen("unacked") == len(lab.specs)
        time.sleep(1.5)
        with lab.app.connection_for_write() as conn:
            conn.default_channel.qos.restore_visible(num=100, interval=1)
        assert lab.client.llen(RECORDS_QUEUE) == len(lab.specs)
        intake = Intake(lab.coordinator)
        assert intake.handle(intake.take()) == len(lab.specs)
        assert sum(len(lab.store.records(CAMPAIGN, h)) for h in HOSTS) == len(lab.specs)
    finally:
        lab.close()


def test_the_report_is_rebuilt_once_for_hosts_that_finish_apart(lab: Lab) -> None:
    """A host finalized while others run marks the campaign's report stale (the sweep rebuilds
    it when due), and the host that completes the campaign rebuilds it before it is final."""
    report = lab.store.campaign_dir(CAMPAIGN) / "report.md"
    intake = Intake(lab.coordinator)
    lab.hand_over([lab.record(s) for s in lab.specs if s.host == "lab-a"])
    intake.handle(intake.take())
    assert lab.coordinator.finalize(CAMPAIGN, "lab-a")["finalized"]
    assert not report.exists() and lab.client.sismember(REPORT_STALE_KEY, CAMPAIGN)
    lab.coordinator.clocks = FleetClocks.from_environment({REPORT_EVERY_ENV: "3600"})
    lab.coordinator.refresh_reports(time.time())  # never built here: due at once
    assert report.exists() and not lab.client.sismember(REPORT_STALE_KEY, CAMPAIGN)
    first = report.read_text()
    assert "have no record yet" in first  # lab-b and lab-c still run
    lab.hand_over([lab.record(s) for s in lab.specs if s.host != "lab-a"])
    intake.handle(intake.take())
    assert lab.coordinator.finalize(CAMPAIGN, "lab-b")["finalized"]
    lab.coordinator.refresh_reports(time.time())  # built a moment ago: not due yet
    assert lab.client.sismember(REPORT_STALE_KEY, CAMPAIGN) and report.read_text() == first
    assert lab.coordinator.finalize(CAMPAIGN, "lab-c")["finalized"]  # the last host
    assert "have no record yet" not in report.read_text()
    assert not lab.client.sismember(REPORT_STALE_KEY, CAMPAIGN)
    assert lab.coordinator.all_finalized(CAMPAIGN)


def test_the_coordinator_clocks_come_from_the_environment_once() -> None:
    """The command reads the clocks once; unset means the default, nonsense is refused."""
    assert FleetClocks.from_environment({}) == FleetClocks()
    clocks = FleetClocks.from_environment({REPORT_EVERY_ENV: "3600", "SANDBENCH_LEASE_SLACK": ""})
    assert clocks.report_every_s == 3600
    assert clocks.lease_slack_s == FleetClocks().lease_slack_s
    for bad in ("ten", "-1", "nan", "inf"):
        with pytest.raises(FleetError, match=r"SANDBENCH_LOST_GRACE=.*number of seconds"):
            FleetClocks.from_environment({"SANDBENCH_LOST_GRACE": bad})
