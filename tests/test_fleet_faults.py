"""Fleet repairs and faults: rerun by task id, kill -9 of a worker, redis restart, coordinator
kill -9, a queued message that vanished, a partitioned host, duplicate delivery, a full disk.

(A worker killed mid staged environment, its leftovers reaped at restart: tests/test_reaper.py.)
"""

from __future__ import annotations

import base64
import csv
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.store.store import Store
from tests.conftest import require
from tests.fleet_helpers import (
    OPS_APPENDFSYNC,
    VISIBILITY_TIMEOUT_S,
    assert_each_once,
    dispatch,
    flaky_mode,
    make_fleet,
    remove_leftover_cgroups,
    slow_mode,
    status,
    wait_finished,
    wait_until,
    write_plan,
)
from tests.leftovers import FILL_FILE, NOTHING, hold, holding_python, leftovers

pytestmark = pytest.mark.fleet
__all__ = ["make_fleet"]  # the fixture, re-used from test_fleet

# Each fault test states its bound: dispatch to every host finalized, fault included.
FAULT_BOUND_S = 120
# A worker that never comes back: its heartbeat expires (15 s), the visibility timeout (6 s) and
# the grace (4 s) pass, the coordinator's sweep (every 2 s) marks the environment lost.
LOST_BOUND_S = 60
# A vanished message: its lease (limit 4 s + slack 3 s after the host's last progress) runs out,
# the sweep (every 2 s) queues it again or marks it lost; then the campaign finishes.
LEASE_BOUND_S = 60
# A partition of the host's link for longer than the visibility timeout (its message comes back).
PARTITION_S = VISIBILITY_TIMEOUT_S + 4


def _plan(fleet: Any, **fields: Any) -> Path:
    """A small plan in the fleet's directory, without the machine-state sentinel (lean in time:
    the faults here concern the environments, and each test counts them)."""
    return write_plan(fleet.root / "plan.toml", sentinel=False, **fields)


def _running(fleet: Any) -> list[str]:
    """Keys of environments whose worker is beating right now."""
    client = fleet.redis.client()
    try:
        return list(client.scan_iter("sandbench:alive:*"))
    finally:
        client.close()


def test_rerun_task_id_reruns_the_failed_cell_as_a_new_attempt(make_fleet: Any) -> None:
    """``rerun TASK_ID`` and ``rerun --failed``: results show attempt 2, records keep attempt 1."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    fleet.start_worker("lab-a")
    fleet.start_coordinator()
    flag = fleet.root / "runtime-installed"
    workloads, modes = ["publish", "seq-write"], [flaky_mode("flaky", flag)]
    plan = _plan(fleet, environments=2, rounds=1, workloads=workloads, modes=modes)
    campaign = dispatch(fleet, plan, "lab-a")
    first = wait_finished(fleet, campaign)
    failures = first["hosts"][0]["failures"]
    assert len(failures) == 2 and first["hosts"][0]["outcomes"] == {"failed": 2, "not-run": 2}
    flag.touch()
    publish = next(f for f in failures if "/publish/" in f["key"])
    out = fleet.cli("rerun", publish["task_id"], "--data", str(fleet.data))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(f"campaign: {campaign}")
    wait_until(lambda: status(fleet, campaign)["hosts"][0]["planned"] == 6, 30, "new attempt")
    wait_finished(fleet, campaign)
    out = fleet.cli("rerun", "--failed", campaign, "--data", str(fleet.data))
    assert out.returncode == 0 and "requeued 2 environments" in out.stdout, out.stderr
    final = wait_finished(fleet, campaign)
    records = Store(fleet.data).records(campaign, "lab-a")
    by_attempt = {a: sorted(r.outcome for r in records if r.attempt == a) for a in (1, 2)}
    assert by_attempt == {1: ["failed", "failed", "not-run", "not-run"], 2: ["passed"] * 4}
    assert all(f["superseded"] for f in final["hosts"][0]["failures"])
    with open(Store(fleet.data).host_dir(campaign, "lab-a") / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["attempt"], r["status"], r["passed"]) for r in rows] == [("2", "complete", "2")] * 2
    text = fleet.cli("status", campaign, "--data", str(fleet.data)).stdout
    assert "lab-a: 8 planned, 4 passed, 2 failed, 2 not run, 0 lost" in text and "finalized" in text


def test_kill9_of_a_worker_mid_environment_reruns_it_once(make_fleet: Any) -> None:
    """A worker killed with SIGKILL mid-environment: redelivered, run again, recorded once."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    worker = fleet.start_worker("lab-a")
    fleet.start_coordinator()
    plan = _plan(
        fleet, environments=3, rounds=1, workloads=["publish"], modes=[slow_mode("slow", 2.0)]
    )
    start = time.monotonic()
    campaign = dispatch(fleet, plan, "lab-a")
    try:
        (killed,) = wait_until(lambda: _running(fleet), 60, "an environment to start")
        worker.kill9()
        fleet.start_worker("lab-a")
        wait_finished(fleet, campaign, FAULT_BOUND_S)
    finally:
        remove_leftover_cgroups(campaign)
    assert time.monotonic() - start < FAULT_BOUND_S
    records = assert_each_once(fleet, campaign, "lab-a")
    assert all(r.outcome == "passed" for r in records), [r.detail for r in records]
    lost = {r.key(): r.fleet["lost_runs"] for r in records}
    assert lost[killed.removeprefix("sandbench:alive:")] == 1
    assert sum(lost.values()) == 1


def test_redis_restart_mid_campaign_loses_nothing(make_fleet: Any) -> None:
    """redis-server killed mid-campaign and restarted from its append-only file (fsync as in
    ops/redis.conf): every environment stored exactly once, the campaign completes, verifies."""
    fleet = make_fleet(["lab-a", "lab-b"])
    config = (fleet.redis.dir / "redis.conf").read_text()
    assert "appendonly yes" in config and f"appendfsync {OPS_APPENDFSYNC}" in config
    fleet.register_hosts()
    for name in fleet.hosts:
        fleet.start_worker(name)
    fleet.start_coordinator()
    plan = _plan(
        fleet, environments=3, rounds=1, workloads=["publish"], modes=[slow_mode("slow", 1.0)]
    )
    start = time.monotonic()
    campaign = dispatch(fleet, plan, "lab-a,lab-b")
    store = Store(fleet.data)
    wait_until(lambda: store.records(campaign, "lab-a"), 60, "a first stored record")
    wait_until(lambda: _running(fleet), 30, "an environment running", 0.05)
    fleet.redis.restart(down_s=2.0)
    final = wait_finished(fleet, campaign, FAULT_BOUND_S)
    assert time.monotonic() - start < FAULT_BOUND_S
    for name, host in zip(fleet.hosts, final["hosts"], strict=True):
        records = assert_each_once(fleet, campaign, name)
        assert all(r.outcome == "passed" for r in records), [r.detail for r in records]
        assert _lines(fleet, campaign, name) == host["planned"] and host["lost"] == 0
    _verify(fleet, campaign)


def test_coordinator_kill_with_records_in_flight_stores_everything_once(make_fleet: Any) -> None:
    """The coordinator stopped while records arrive, then killed with SIGKILL and restarted:
    the records waiting in its queue (one taken, unacknowledged) are each stored once."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    fleet.start_worker("lab-a")
    coordinator = fleet.start_coordinator()
    workloads = ["publish", "seq-write"]
    plan = _plan(
        fleet, environments=3, rounds=1, workloads=workloads, modes=[slow_mode("slow", 0.5)]
    )
    start = time.monotonic()
    campaign = dispatch(fleet, plan, "lab-a")
    store = Store(fleet.data)
    wait_until(lambda: store.records(campaign, "lab-a"), 60, "a first stored record")
    os.killpg(coordinator.popen.pid, signal.SIGSTOP)  # frozen wherever it was, mid-store too
    stored = len(store.records(campaign, "lab-a"))
    wait_until(lambda: _handed_over(fleet, campaign) >= stored + 2, 60, "records in flight")
    coordinator.kill9()
    fleet.start_coordinator()
    final = wait_finished(fleet, campaign, FAULT_BOUND_S)
    assert time.monotonic() - start < FAULT_BOUND_S
    records = assert_each_once(fleet, campaign, "lab-a")
    assert all(r.outcome == "passed" for r in records), [r.detail for r in records]
    (host,) = final["hosts"]
    assert _lines(fleet, campaign, "lab-a") == host["planned"] and host["lost"] == 0
    assert (Path(store.host_dir(campaign, "lab-a")) / "results.csv").exists()
    _verify(fleet, campaign)


def test_a_worker_that_never_returns_leaves_its_environment_marked_lost(make_fleet: Any) -> None:
    """A worker killed for good: its environment is marked lost with a reason, the host final."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    worker = fleet.start_worker("lab-a")
    fleet.start_coordinator()
    plan = _plan(
        fleet, environments=1, rounds=1, workloads=["publish"], modes=[slow_mode("slow", 3.0)]
    )
    start = time.monotonic()
    campaign = dispatch(fleet, plan, "lab-a")
    try:
        wait_until(lambda: _running(fleet), 60, "the environment to start")
        worker.kill9()
        final = wait_finished(fleet, campaign, LOST_BOUND_S)
    finally:
        remove_leftover_cgroups(campaign)
    assert time.monotonic() - start < LOST_BOUND_S + 60
    (host,) = final["hosts"]
    assert host["lost"] == 1 and host["outcomes"] == {}
    assert host["failures"][0]["reason"].startswith("lost: worker stopped mid-environment")


def _lines(fleet: Any, campaign: str, host: str) -> int:
    """Lines of the host's records file: a duplicate stored would show as one more."""
    path = Store(fleet.data).records_path(campaign, host)
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def _handed_over(fleet: Any, campaign: str) -> int:
    """Environments whose record a worker has handed over (its done mark is set)."""
    client = fleet.redis.client()
    try:
        return sum(1 for _ in client.scan_iter(f"sandbench:done:{campaign}/*"))
    finally:
        client.close()


def _verify(fleet: Any, campaign: str) -> None:
    """``sandbench verify`` passes on the campaign as stored."""
    out = fleet.cli("verify", campaign, "--data", str(fleet.data))
    assert out.returncode == 0, out.stdout + out.stderr


def _remove_queued(fleet: Any, host: str, task_id: str) -> None:
    """Delete the queued message of ``task_id`` from ``host``'s queue in Redis, by hand."""
    client = fleet.redis.client()
    try:
        queue = f"host.{host}"
        (message,) = [m for m in client.lrange(queue, 0, -1) if task_id in m]
        assert client.lrem(queue, 1, message) == 1
    finally:
        client.close()


def test_a_queued_message_that_vanished_is_queued_again_and_verifies(make_fleet: Any) -> None:
    """A message deleted from the host's queue never starts: the coordinator queues it again
    (same key and attempt) once its lease ran out, the campaign completes and verifies."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    fleet.start_coordinator()
    plan = _plan(fleet, environments=2, rounds=1, workloads=["publish"], limit_s=4)
    campaign = dispatch(fleet, plan, "lab-a")
    vanished = Store(fleet.data).load_campaign(campaign).host_specs("lab-a")[0]
    _remove_queued(fleet, "lab-a", str(vanished.task_id))
    fleet.start_worker("lab-a")
    final = wait_finished(fleet, campaign, LEASE_BOUND_S)
    (host,) = final["hosts"]
    assert host["requeued"] == 1 and host["lost"] == 0, host
    records = assert_each_once(fleet, campaign, "lab-a")
    assert all(r.outcome == "passed" and r.attempt == 1 for r in records)
    assert "queued again" in fleet.coordinator.text()
    _verify(fleet, campaign)


def test_a_queued_message_of_a_host_that_is_gone_is_marked_lost(make_fleet: Any) -> None:
    """With no worker of its host alive, a queued environment that never starts is marked lost
    with a reason once its lease ran out; status says so and the host is finalized."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    fleet.start_coordinator()
    plan = _plan(fleet, environments=1, rounds=1, workloads=["publish"], limit_s=4)
    campaign = dispatch(fleet, plan, "lab-a")
    (spec,) = Store(fleet.data).load_campaign(campaign).host_specs("lab-a")
    _remove_queued(fleet, "lab-a", str(spec.task_id))
    final = wait_finished(fleet, campaign, LEASE_BOUND_S)
    (host,) = final["hosts"]
    assert host["lost"] == 1 and host["requeued"] == 0 and host["outcomes"] == {}, host
    reason = "lost: queued but never started, and no worker of host lab-a is alive"
    assert host["failures"][0]["reason"] == reason
    text = fleet.cli("status", campaign, "--data", str(fleet.data)).stdout
    assert "1 lost" in text and f"lost {spec.key()}: queued but never started" in text, text


def _runs(fleet: Any, task_id: str) -> int:
    """How many times the worker ran ``task_id``'s environment to a record (its log)."""
    lines = fleet.workers["lab-a"].text().splitlines()
    return sum(1 for line in lines if f"[{task_id}] succeeded" in line and "outcome:" in line)


def test_a_partition_longer_than_the_visibility_timeout_runs_once_more_at_most(
    make_fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host cut off from Redis (its veth down) past the visibility timeout, then healed: its
    environment ran at most once more, the first record stored wins (a later one is dropped
    and counted), every environment has one record and verify passes."""
    fleet = make_fleet(["lab-a"], netns=True)
    monkeypatch.setenv("SANDBENCH_PYTHON", str(holding_python(fleet.root)))
    host = fleet.hosts["lab-a"]
    hold(host.work_root, 3)
    fleet.register_hosts()
    fleet.start_worker("lab-a")
    fleet.start_coordinator()
    plan = _plan(fleet, environments=2, rounds=1, workloads=["publish"])
    campaign = dispatch(fleet, plan, "lab-a")
    (alive,) = wait_until(lambda: _running(fleet), 60, "the first environment to start", 0.05)
    key = alive.removeprefix("sandbench:alive:")
    link = host.netns.link
    subprocess.run(["ip", "link", "set", link, "down"], check=True)
    time.sleep(PARTITION_S)
    subprocess.run(["ip", "link", "set", link, "up"], check=True)
    final = wait_finished(fleet, campaign, FAULT_BOUND_S)
    records = assert_each_once(fleet, campaign, "lab-a")
    assert all(r.outcome == "passed" for r in records), [r.detail for r in records]
    task_id = str(Store(fleet.data).load_campaign(campaign).spec_by_key()[key].task_id)
    runs = _runs(fleet, task_id)
    assert 1 <= runs <= 2, fleet.logs_text()
    assert final["hosts"][0]["duplicates"] == runs - 1
    redelivered = f"duplicate delivery of {key}" in fleet.workers["lab-a"].text()
    assert runs == 2 or redelivered, fleet.logs_text()  # the message did come back
    _verify(fleet, campaign)


def _carries(message: str, needle: str) -> bool:
    """Whether a queued message's body (kombu's envelope: base64) contains ``needle`` (headers
    do not count: a task sent from within another names that one as its parent)."""
    try:
        body = json.loads(message)["body"]
        return needle in base64.b64decode(body).decode(errors="replace")
    except (ValueError, KeyError, TypeError):
        return needle in message  # not kombu's envelope: the message is its body


def _copy_queued(fleet: Any, needle: str, queue: str | None = None) -> str:
    """Push a byte-for-byte copy of the one queued message carrying ``needle`` (a redelivery)
    onto its queue (``queue``, else whichever queue holds it); that queue's name."""
    client = fleet.redis.client()
    try:
        queues = [queue] if queue else list(client.scan_iter(_type="list"))
        found = [(q, m) for q in queues for m in client.lrange(q, 0, -1) if _carries(m, needle)]
        ((where, message),) = found
        client.lpush(where, message)
        return str(where)
    finally:
        client.close()


def test_duplicate_deliveries_of_a_message_give_one_record(make_fleet: Any) -> None:
    """The same environment message queued twice runs once; the same record message queued
    twice is stored once, the copy dropped and counted; verify passes."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    plan = _plan(fleet, environments=2, rounds=1, workloads=["publish"])
    campaign = dispatch(fleet, plan, "lab-a")
    first, _second = Store(fleet.data).load_campaign(campaign).host_specs("lab-a")
    _copy_queued(fleet, str(first.task_id), queue="host.lab-a")
    fleet.start_worker("lab-a")
    wait_until(lambda: _handed_over(fleet, campaign) == 2, 60, "both records handed over")
    wait_until(lambda: f"duplicate delivery of {first.key()}" in fleet.workers["lab-a"].text(),
               30, "the copy dropped by the worker")  # fmt: skip
    _copy_queued(fleet, str(first.task_id))  # its record, waiting for the coordinator
    fleet.start_coordinator()
    final = wait_finished(fleet, campaign, FAULT_BOUND_S)
    assert final["hosts"][0]["duplicates"] == 1, final
    assert _runs(fleet, str(first.task_id)) == 1
    records = assert_each_once(fleet, campaign, "lab-a")
    assert _lines(fleet, campaign, "lab-a") == len(records) == 2
    _verify(fleet, campaign)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs to be a work root."""
    require(os.geteuid() == 0, "root (mount a tmpfs)")
    point = tmp_path / "small-disk"
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "sbdisk", str(point)], check=True)
    yield point
    subprocess.run(["umount", "-l", str(point)], check=False)


def test_a_full_work_root_disk_is_no_space_and_the_worker_goes_on(
    make_fleet: Any, monkeypatch: pytest.MonkeyPatch, small_disk: Path
) -> None:
    """An environment whose work-root disk fills up mid-way is resource/no-space; the worker
    stays up, frees the space and passes the next campaign's environment."""
    fleet = make_fleet(["lab-a"])
    host = fleet.hosts["lab-a"]
    host.work_root = small_disk
    monkeypatch.setenv("SANDBENCH_PYTHON", str(holding_python(fleet.root)))
    (small_disk / FILL_FILE).touch()
    fleet.register_hosts()
    worker = fleet.start_worker("lab-a")
    fleet.start_coordinator()
    plan = _plan(fleet, environments=1, rounds=1, workloads=["publish"])
    try:
        full = dispatch(fleet, plan, "lab-a")
        wait_finished(fleet, full, FAULT_BOUND_S)
        (record,) = assert_each_once(fleet, full, "lab-a")
        assert (record.outcome, record.failure_class, record.reason) == (
            "failed", "resource", "no-space"), record.detail  # fmt: skip
        (small_disk / FILL_FILE).unlink()
        after = dispatch(fleet, plan, "lab-a")
        wait_finished(fleet, after, FAULT_BOUND_S)
        (record,) = assert_each_once(fleet, after, "lab-a")
        assert record.outcome == "passed", record.detail
        assert worker.alive() and fleet.workers["lab-a"] is worker
        assert leftovers(small_disk, full) == leftovers(small_disk, after) == NOTHING
    finally:
        fleet.close()
