"""Fleet repairs and faults: rerun by task id, kill -9 of a worker (its leftovers reaped), redis
restart, coordinator kill -9, a queued message that vanished, a partitioned host, duplicate
delivery, a full work-root disk."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import psutil
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
from tests.leftovers import (
    cgroup_dirs,
    cgroup_pids,
    env_names,
    hold,
    holding_python,
    leftovers,
    mounts_under,
)
from worker.cgroupsv1 import CONTROLLERS
from worker.quota import cgroup_mounts, detect

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


def _runs(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie waiting for its parent."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _holding(work_root: Path) -> str:
    """Wait until an environment of ``work_root`` has its overlay mounted and runs; its name."""

    def ready() -> str | None:
        for name in env_names(work_root):
            merged = work_root / "envs" / name / "env" / "stage" / "merged"
            if merged.is_mount() and len(cgroup_pids(cgroup_dirs(name))) >= 2:
                return name
        return None

    return wait_until(ready, 60, f"an environment holding in {work_root}", 0.05)


def test_kill9_mid_staged_environment_leftovers_are_reaped_before_the_next(
    make_fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed mid staged environment leaves a mount, cgroups in every hierarchy,
    processes and a workspace; restarted, it reaps them before its next environment, while the
    other worker's running environment is untouched and passes."""
    fleet = make_fleet(["lab-a", "lab-b"])
    monkeypatch.setenv("SANDBENCH_PYTHON", str(holding_python(fleet.root)))
    a, b = fleet.hosts["lab-a"].work_root, fleet.hosts["lab-b"].work_root
    hold(a, 600)
    hold(b, 20)
    fleet.register_hosts()
    worker = fleet.start_worker("lab-a")
    fleet.start_worker("lab-b")
    fleet.start_coordinator()
    plan = write_plan(fleet.root / "plan.toml", environments=1, rounds=1, workloads=["publish"],
                      modes=["staged"], limit_s=60, sentinel=False)  # fmt: skip
    campaign = dispatch(fleet, plan, "lab-a,lab-b")
    try:
        killed, running = _holding(a), _holding(b)
        groups = cgroup_dirs(killed)
        if detect() == 1:  # the environment's cgroup is in every v1 controller's hierarchy
            mounts = cgroup_mounts()
            assert {mounts[c] for c in CONTROLLERS if c in mounts} <= {g.parents[1] for g in groups}
        strays, others = cgroup_pids(groups), cgroup_pids(cgroup_dirs(running))
        worker.kill9()
        hold(a, 0)
        assert all(_runs(p) for p in strays) and mounts_under(a)
        restarted = fleet.start_worker("lab-a")
        assert killed not in env_names(a) and cgroup_dirs(killed) == []
        assert not [m for m in mounts_under(a) if killed in m]
        assert not [p for p in strays if _runs(p)]
        assert (b / "envs" / running / "env" / "stage" / "merged").is_mount()
        assert cgroup_dirs(running) and all(_runs(p) for p in others)
        wait_finished(fleet, campaign, FAULT_BOUND_S)
    finally:
        remove_leftover_cgroups(campaign)
    log = restarted.own_text()
    assert f"reaper: reaped mount {a}/envs/{killed}/env/stage/merged" in log, log
    assert log.index("reaper: reaped") < log.index("Task run_environment[")
    for name in fleet.hosts:
        (record,) = assert_each_once(fleet, campaign, name)
        assert record.outcome == "passed", record.detail
    assert leftovers(a, campaign) == leftovers(b, campaign) == {
        "processes": [], "cgroups": [], "mounts": [], "files": []
    }  # fmt: skip


def test_a_queued_message_that_vanished_is_queued_again_and_verifies(make_fleet: Any) -> None:
    """A message deleted from the host's queue never starts: the coordinator queues it again
    (same key and attempt) once its lease ran out, the campaign completes and verifies."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    fleet.start_coordinator()
    plan = write_plan(fleet.root / "plan.toml", environments=2, rounds=1, workloads=["publish"],
                      limit_s=4, sentinel=False)  # fmt: skip
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
    plan = write_plan(fleet.root / "plan.toml", environments=1, rounds=1, workloads=["publish"],
                      limit_s=4, sentinel=False)  # fmt: skip
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
