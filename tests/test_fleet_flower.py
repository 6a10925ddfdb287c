"""Flower watches the fleet: its API lists a running campaign's tasks by name, read-only."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from coordinator.store import Store
from tests.fleet_helpers import (
    PYTHON,
    Fleet,
    dispatch,
    free_port,
    make_fleet,
    slow_mode,
    status,
    wait_finished,
    wait_until,
    write_plan,
)
from tests.flower_view import ACTIONS, FlowerView

pytestmark = pytest.mark.fleet
__all__ = ["make_fleet"]

FLOWER_USER, FLOWER_PASSWORD = "lab", "flower-test-secret"
QUIET_S = 3.0  # how long a refused action has to show any effect before we call it inert


def start_flower(fleet: Fleet) -> FlowerView:
    """``sandbench flower`` for ``fleet`` on a free port, answering; its view."""
    port = free_port()
    env = fleet.env(fleet.coordinator_home, fleet.redis.url())
    env["SANDBENCH_FLOWER_AUTH"] = f"{FLOWER_USER}:{FLOWER_PASSWORD}"
    flower = fleet.spawn(
        [PYTHON, "-m", "coordinator", "flower", "--port", str(port)], env, "flower"
    )
    view = FlowerView(f"http://127.0.0.1:{port}", FLOWER_USER, FLOWER_PASSWORD)
    wait_until(lambda: view.answers() or not flower.alive(), 60, "Flower")
    assert flower.alive(), flower.text()
    return view


def test_flower_api_lists_the_running_campaign_by_task_name(make_fleet: Any) -> None:
    """While a campaign runs, Flower's /api/tasks lists its environments by name, behind auth."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    view = start_flower(fleet)
    fleet.start_worker("lab-a")
    fleet.start_coordinator()
    plan = write_plan(fleet.root / "plan.toml", environments=3, rounds=1, workloads=["publish"],
                      modes=[slow_mode("slow", 2.0)])  # fmt: skip
    campaign = dispatch(fleet, plan, "lab-a")
    planned = {s.task_id for s in Store(fleet.data).load_campaign(campaign).specs}

    def all_listed() -> dict[str, Any]:
        tasks = {k: v for k, v in view.tasks().items() if k in planned}
        return tasks if len(tasks) == len(planned) else {}

    seen = wait_until(all_listed, 60, "Flower to list every task")
    assert not status(fleet, campaign)["finished"], "the campaign should still be running"
    assert {t["name"] for t in seen.values()} == {"run_environment"}
    assert all("lab-a slow/publish #" in t["args"] for t in seen.values()), seen
    assert view.get("/api/tasks", auth=False)[0] == 401
    wait_finished(fleet, campaign)


def test_flower_refuses_every_action_and_no_task_runs(make_fleet: Any) -> None:
    """POSTs that would apply, send, revoke a task or control a worker get 403; nothing runs."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    view = start_flower(fleet)
    worker = fleet.start_worker("lab-a")
    name = wait_until(lambda: list(view.json("/api/workers?refresh=1")), 60, "lab-a in Flower")[0]
    spec = {"campaign": "c-flower", "host": "lab-a", "mode": "native", "workload": "publish",
            "env_index": 0, "work_root": str(fleet.hosts["lab-a"].work_root)}  # fmt: skip
    refused = {}
    for action, (template, body) in ACTIONS.items():
        path = template.format(task="run_environment", task_id="0" * 32, worker=name)
        refused[action] = view.post(path, {**body, "args": [spec]} if "args" in body else body)
    assert {a: code for a, (code, _) in refused.items()} == dict.fromkeys(ACTIONS, 403), refused
    assert all("Read only mode is enabled" in text for _, text in refused.values()), refused
    time.sleep(QUIET_S)
    client = fleet.redis.client()
    try:
        assert client.llen("host.lab-a") == 0 and client.llen("coordinator") == 0
    finally:
        client.close()
    assert view.tasks() == {} and view.tasks("finalize_host") == {}
    assert worker.alive() and "run_environment[" not in worker.text(), worker.text()[-2000:]
    assert json.loads(view.get("/api/workers?refresh=1")[1]).keys() == {name}
