"""One gate, two transports: the same specs give the same records locally and in a real fleet."""

from __future__ import annotations

from typing import Any

import pytest

from contract.app import create_app
from contract.records import NOT_RUN_RULE, NotRun, not_run_kind
from coordinator.fleet.dispatch import dispatch_specs
from coordinator.local import LocalExecutor
from coordinator.plan.campaign import expand
from coordinator.plan.file import parse_plan
from coordinator.results.finalize import finalize_host
from coordinator.store.policy import verify_campaign
from coordinator.store.store import Store
from coordinator.store.trust import HostRegistry
from tests.fleet_helpers import Fleet, make_fleet, wait_finished, wait_until

pytestmark = pytest.mark.fleet
__all__ = ["make_fleet"]  # the fixture

HOSTS = ["lab-a", "lab-b"]
CAMPAIGN = "c-20261201-7a11"
# A passing mode, a mode that fails at startup (first-failure rule) and one whose preflight fails.
PLAN = """
name = "transports"
seed = 11
scale = 0.02
environments = 2
rounds = 2
limit_s = 30
workloads = ["publish", "seq-write"]
modes = [
  "native",
  { name = "always-fails", template = ["/bin/false", "{payload_argv}"] },
  { name = "absent", template = ["/nonexistent/sandbox-runtime", "{payload_argv}"] },
]
[quota]
memory = "1GiB"
"""
# Measured on each run, or signed per record: never equal between two runs of the same spec.
MEASURED = ("started_at", "ready_ms", "cpu_s", "payload_cpu_s", "peak_memory_bytes", "wall_s",
            "phases", "steps", "spans", "signature")  # fmt: skip
# the launcher's CPU time before it joined the cgroup; whether its shim started ahead of the
# marker (the embedded run's, beside the environment before: a fleet worker knows no next one)
MEASURED_PROVENANCE = ("prejoin_cpu_s", "shim_started_ahead")
# the fleet's own timing and redelivery counts; each store's link (its own chain and key); the
# preparation the embedded run does ahead (a fleet worker knows no next environment)
PER_TRANSPORT = ("fleet", "chain", "overlapped_s")


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A record without its measurements, signature, per-run names and per-transport fields."""
    out = {k: v for k, v in record.items() if k not in MEASURED + PER_TRANSPORT}
    out["rounds"] = [{k: v for k, v in r.items() if k != "task_s"} for r in record["rounds"]]
    cgroup = dict(out["provenance"].get("cgroup", {}))
    cgroup.pop("path", None)  # the environment's cgroup carries a random suffix per run
    provenance = {k: v for k, v in out["provenance"].items() if k not in MEASURED_PROVENANCE}
    out["provenance"] = {**provenance, "cgroup": cgroup}
    return out


def run_locally(fleet: Fleet, store: Store) -> None:
    """Each host's environments through the embedded executor, with that host's key and root,
    each host finalized as ``sandbench run`` does."""
    for name in HOSTS:
        host = fleet.hosts[name]
        result = LocalExecutor(store, CAMPAIGN, host.key, host.work_root).run(show_progress=False)
        assert result.complete, result
        finalize_host(store, CAMPAIGN, name)


def verdicts(store: Store, host: str) -> dict[str, bool] | None:
    """Each mode's preflight verdict in the host's provenance, once all three are there."""
    modes = store.provenance(CAMPAIGN, host).get("modes", {})
    return {m: v["ok"] for m, v in modes.items()} if len(modes) == 3 else None


def records_by_key(store: Store) -> dict[str, dict[str, Any]]:
    """Every stored record of the campaign as JSON, by environment key."""
    return {r.key(): r.to_json_dict() for r in store.records(CAMPAIGN)}


def test_local_and_fleet_records_are_identical_but_for_timings(make_fleet: Any) -> None:
    """One plan embedded and through a two-worker fleet: equal records and verdicts, verified."""
    fleet = make_fleet(HOSTS)
    fleet.register_hosts()
    for name in HOSTS:
        fleet.start_worker(name)
    fleet.start_coordinator()
    plan = parse_plan(PLAN)
    specs = expand(plan, HOSTS, CAMPAIGN, str(fleet.root / "planned-work-root"))
    local = Store(fleet.root / "local-data", signer=fleet.coordinator_key)
    local.create_campaign(PLAN, plan, specs)
    run_locally(fleet, local)
    app = create_app(fleet.redis.url())
    try:
        dispatch_specs(app, Store(fleet.data, signer=fleet.coordinator_key), PLAN, plan, specs)
    finally:
        app.close()
    wait_finished(fleet, CAMPAIGN)
    embedded, fleet_records = records_by_key(local), records_by_key(Store(fleet.data))
    assert sorted(embedded) == sorted(fleet_records) == sorted(s.key() for s in specs)
    for key, record in embedded.items():
        assert comparable(record) == comparable(fleet_records[key]), key
        assert "fleet" in fleet_records[key] and "fleet" not in record
    reasons = {(r["mode"], r["outcome"], r["reason"]) for r in fleet_records.values()}
    assert ("native", "passed", None) in reasons
    assert ("always-fails", "failed", "no-ready") in reasons
    assert ("always-fails", "not-run", NOT_RUN_RULE) in reasons
    absent = {r["reason"] for r in fleet_records.values() if r["mode"] == "absent"}
    assert len(absent) == 1 and not_run_kind("not-run", absent.pop()) is NotRun.PREFLIGHT
    for name in HOSTS:  # each host's provenance lists the same preflight verdicts
        fleet_modes = wait_until(lambda n=name: verdicts(Store(fleet.data), n), 60, "verdicts")
        assert fleet_modes == verdicts(local, name)
        assert fleet_modes == {"native": True, "always-fails": True, "absent": False}
    registry = HostRegistry(fleet.coordinator_home / "hosts.json")
    for store in (local, Store(fleet.data)):  # both sealed by finalize_host: verified
        checked = verify_campaign(store, CAMPAIGN, registry)
        assert checked.ok and checked.verdict.startswith("verified"), checked
