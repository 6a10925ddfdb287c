"""The fleet against a real redis-server and real worker processes: dispatch, order, records."""

from __future__ import annotations

import csv
import itertools
from typing import Any

import pytest

from contract.app import TASK_STORE, create_app
from contract.records import EnvironmentRecord
from contract.signing import HostKey, sign_record
from coordinator.store.store import Store
from tests.fleet_helpers import (
    Fleet,
    assert_each_once,
    dispatch,
    make_fleet,
    records_of,
    slow_mode,
    status,
    wait_finished,
    wait_until,
    write_plan,
)
from worker.config import COORDINATOR_PUB

pytestmark = pytest.mark.fleet
__all__ = ["make_fleet"]  # the fixture


def test_two_hosts_in_namespaces_run_each_environment_once_in_order(make_fleet: Any) -> None:
    """Two workers in their own network namespaces run every environment once, in order."""
    fleet = make_fleet(["lab-a", "lab-b"], netns=True)
    fleet.register_hosts()
    for name in fleet.hosts:
        fleet.start_worker(name)
    fleet.start_coordinator()
    plan = write_plan(fleet.root / "plan.toml", environments=2, rounds=1)
    campaign = dispatch(fleet, plan, "lab-a,lab-b")
    final = wait_finished(fleet, campaign)
    for name, host in fleet.hosts.items():
        assert host.netns is not None
        assert f"@{host.netns.host_address}:" in fleet.workers[name].text()
        records = assert_each_once(fleet, campaign, name)
        records.sort(key=lambda r: r.fleet["runner_start"])
        assert [r.order_index for r in records] == sorted(r.order_index for r in records)
        for before, after in itertools.pairwise(records):
            assert before.fleet["runner_end"] <= after.fleet["runner_start"], "overlap on a host"
        assert all(r.outcome == "passed" for r in records), [r.reason for r in records]
        with open(Store(fleet.data).host_dir(campaign, name) / "results.csv") as f:
            rows = list(csv.DictReader(f))
        assert rows and {row["host"] for row in rows} == {name}
        provenance = Store(fleet.data).provenance(campaign, name)
        assert provenance["host"] == name and provenance["campaign"] == campaign
        assert provenance["quota"]["memory_bytes"] == 1024**3  # the plan's quota
        clock = provenance["clock_vs_broker"]  # one machine: one clock, a local round trip
        assert abs(clock["offset_s"]) < clock["rtt_s"] + 0.05 and 0 < clock["rtt_s"] < 1, clock
    assert all(h["finalized"] for h in final["hosts"])


def _forged(fleet: Fleet, campaign: str, host: str, index: int) -> dict[str, Any]:
    """An unsigned passed record of ``host``'s ``index``-th planned environment."""
    spec = Store(fleet.data).load_campaign(campaign).host_specs(host)[index]
    return EnvironmentRecord.from_spec(spec, outcome="passed", ready_ms=12.5).to_json_dict()


def test_forged_records_are_rejected_logged_and_counted_missing(make_fleet: Any) -> None:
    """Wrong key, one changed byte and an unregistered host: each rejected, logged, not stored."""
    fleet = make_fleet(["lab-a", "lab-b", "lab-c"])
    fleet.register_hosts(["lab-a", "lab-b"])
    fleet.start_coordinator()
    plan = write_plan(fleet.root / "plan.toml", environments=1, rounds=1, workloads=["publish"])
    # no worker: only forged records arrive; lab-c is unregistered on purpose
    campaign = dispatch(fleet, plan, "lab-b,lab-c", "--allow-unregistered")
    lab_a, lab_b, lab_c = (fleet.hosts[n].key for n in ("lab-a", "lab-b", "lab-c"))
    impostor = HostKey("lab-b", lab_a.private)  # lab-a's key claiming to be lab-b
    claimed = sign_record(EnvironmentRecord.model_validate(_forged(fleet, campaign, "lab-b", 0)),
                          impostor).to_json_dict()  # fmt: skip
    tampered = sign_record(EnvironmentRecord.model_validate(_forged(fleet, campaign, "lab-b", 0)),
                           lab_b).to_json_dict()  # fmt: skip
    tampered["ready_ms"] = 12.4  # one byte of the signed JSON changed
    unknown = sign_record(EnvironmentRecord.model_validate(_forged(fleet, campaign, "lab-c", 0)),
                          lab_c).to_json_dict()  # fmt: skip
    app = create_app(fleet.redis.url())
    try:
        for record in (claimed, tampered, unknown):
            app.send_task(TASK_STORE, args=[record], queue="coordinator")
    finally:
        app.close()
    wait_until(lambda: status(fleet, campaign)["rejected"] == 3, 60, "three rejections")
    final = status(fleet, campaign)
    assert [h["left"] for h in final["hosts"]] == [h["planned"] for h in final["hosts"]]
    assert records_of(fleet, campaign, "lab-b") == [] and records_of(fleet, campaign, "lab-c") == []
    log = fleet.coordinator.text() if fleet.coordinator else ""
    assert "not the registered key of 'lab-b'" in log
    assert "bad signature" in log
    assert "unknown host 'lab-c'" in log


def test_dispatch_to_an_unregistered_host_is_refused_unless_allowed(make_fleet: Any) -> None:
    """dispatch naming a host not in the registry exits 2 with one line naming the host and
    'sandbench hosts add', storing nothing; --allow-unregistered queues it with a warning."""
    fleet = make_fleet(["lab-a", "lab-b"])
    fleet.register_hosts(["lab-a"])
    plan = write_plan(fleet.root / "plan.toml", environments=1, rounds=1, workloads=["publish"])
    out = fleet.cli("dispatch", str(plan), "--hosts", "lab-a,lab-b", "--data", str(fleet.data))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout == "" and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "host lab-b is not registered" in out.stderr
    assert "sandbench hosts add lab-b" in out.stderr
    assert not fleet.data.exists() or Store(fleet.data).campaign_ids() == []
    assert fleet.redis.client().keys("*") == []  # nothing queued, nothing watched
    campaign = dispatch(fleet, plan, "lab-a,lab-b", "--allow-unregistered")
    assert Store(fleet.data).campaign_ids() == [campaign]


def test_status_shows_a_workers_refusals_and_a_host_never_seen(make_fleet: Any) -> None:
    """A worker that trusts no coordinator key refuses every spec; status counts the refusals
    under its host ('refused N: untrusted coordinator key') and names a host with no worker."""
    fleet = make_fleet(["lab-a", "lab-b"])
    fleet.register_hosts()
    (fleet.hosts["lab-a"].home / COORDINATOR_PUB).unlink()  # lab-a trusts no coordinator key
    fleet.start_coordinator()
    fleet.start_worker("lab-a")
    plan = write_plan(fleet.root / "plan.toml", environments=2, rounds=1, workloads=["publish"],
                      sentinel=False)  # fmt: skip
    campaign = dispatch(fleet, plan, "lab-a,lab-b")
    planned = status(fleet, campaign)["hosts"][0]["planned"]
    refused = lambda: status(fleet, campaign)["hosts"][0]["refused"]  # noqa: E731
    wait_until(lambda: refused().get("untrusted coordinator key") == planned, 60, "refusals")
    lab_a, lab_b = status(fleet, campaign)["hosts"]
    assert lab_a["worker"] == "alive" and lab_b["worker"] == "never seen"
    assert lab_a["outcomes"] == {} and records_of(fleet, campaign, "lab-a") == []
    out = fleet.cli("status", campaign, "--data", str(fleet.data))
    assert out.returncode == 0, out.stderr
    assert f"refused {planned}: untrusted coordinator key" in out.stdout, out.stdout
    assert "worker not seen: no 'sandbench worker --host lab-b'" in out.stdout, out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_status_counts_command_modes_a_worker_does_not_allow(make_fleet: Any) -> None:
    """A command mode missing from the worker's allowlist is not run; status counts it under
    the host as 'refused N: command mode not allowed' beside the native environments that ran."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    fleet.start_coordinator()
    fleet.start_worker("lab-a")
    plan = write_plan(fleet.root / "plan.toml", environments=2, rounds=1, workloads=["publish"],
                      modes=["native", slow_mode("not-allowed", 0)], sentinel=False)  # fmt: skip
    campaign = dispatch(fleet, plan, "lab-a")
    final = wait_finished(fleet, campaign)["hosts"][0]
    assert final["refused"] == {"command mode not allowed": 2}, final
    assert final["outcomes"] == {"passed": 2, "not-run": 2}, final
    out = fleet.cli("status", campaign, "--data", str(fleet.data))
    assert "refused 2: command mode not allowed" in out.stdout, out.stdout
