"""Fleet repairs and faults: rerun by task id, kill -9 of a worker, redis restart, coordinator."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import pytest

from coordinator.store import Store
from tests.fleet_helpers import (
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

pytestmark = pytest.mark.fleet
__all__ = ["make_fleet"]  # the fixture, re-used from test_fleet

# Each fault test states its bound: dispatch to every host finalized, fault included.
FAULT_BOUND_S = 120
# A worker that never comes back: its heartbeat expires (15 s), the visibility timeout (6 s) and
# the grace (4 s) pass, the coordinator's sweep (every 2 s) marks the environment lost.
LOST_BOUND_S = 60


def _running(fleet: Any) -> list[str]:
    """Keys of environments whose worker is beating right now."""
    client = fleet.redis.client()
    try:
        return [k for k in client.scan_iter("sandbench:alive:*")]
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
    plan = write_plan(fleet.root / "plan.toml", environments=2, rounds=1, workloads=workloads,
                      modes=modes)  # fmt: skip
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
    plan = write_plan(fleet.root / "plan.toml", environments=3, rounds=1, workloads=["publish"],
                      modes=[slow_mode("slow", 2.0)])  # fmt: skip
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
    """redis-server killed and restarted from its append-only file: every environment once."""
    fleet = make_fleet(["lab-a", "lab-b"])
    fleet.register_hosts()
    for name in fleet.hosts:
        fleet.start_worker(name)
    fleet.start_coordinator()
    plan = write_plan(fleet.root / "plan.toml", environments=3, rounds=1, workloads=["publish"],
                      modes=[slow_mode("slow", 1.0)])  # fmt: skip
    start = time.monotonic()
    campaign = dispatch(fleet, plan, "lab-a,lab-b")
    store = Store(fleet.data)
    wait_until(lambda: store.records(campaign, "lab-a"), 60, "a first stored record")
    fleet.redis.restart(down_s=2.0)
    wait_finished(fleet, campaign, FAULT_BOUND_S)
    assert time.monotonic() - start < FAULT_BOUND_S
    for name in fleet.hosts:
        records = assert_each_once(fleet, campaign, name)
        assert all(r.outcome == "passed" for r in records), [r.detail for r in records]


def test_coordinator_kill_and_restart_stores_everything_once(make_fleet: Any) -> None:
    """The coordinator killed with SIGKILL and restarted: records wait in its queue, none lost."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    fleet.start_worker("lab-a")
    coordinator = fleet.start_coordinator()
    workloads = ["publish", "seq-write"]
    plan = write_plan(fleet.root / "plan.toml", environments=3, rounds=1, workloads=workloads,
                      modes=[slow_mode("slow", 0.5)])  # fmt: skip
    start = time.monotonic()
    campaign = dispatch(fleet, plan, "lab-a")
    store = Store(fleet.data)
    wait_until(lambda: store.records(campaign, "lab-a"), 60, "a first stored record")
    coordinator.kill9()
    time.sleep(VISIBILITY_TIMEOUT_S / 2)  # records pile up in the coordinator's queue
    fleet.start_coordinator()
    wait_finished(fleet, campaign, FAULT_BOUND_S)
    assert time.monotonic() - start < FAULT_BOUND_S
    records = assert_each_once(fleet, campaign, "lab-a")
    assert all(r.outcome == "passed" for r in records), [r.detail for r in records]
    assert (Path(store.host_dir(campaign, "lab-a")) / "results.csv").exists()


def test_a_worker_that_never_returns_leaves_its_environment_marked_lost(make_fleet: Any) -> None:
    """A worker killed for good: its environment is marked lost with a reason, the host final."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    worker = fleet.start_worker("lab-a")
    fleet.start_coordinator()
    plan = write_plan(fleet.root / "plan.toml", environments=1, rounds=1, workloads=["publish"],
                      modes=[slow_mode("slow", 3.0)])  # fmt: skip
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
