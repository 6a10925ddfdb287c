"""Flower watches the fleet: its HTTP API lists a running campaign's tasks by name."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from coordinator.store import Store
from tests.fleet_helpers import (
    PYTHON,
    dispatch,
    free_port,
    make_fleet,
    slow_mode,
    status,
    wait_finished,
    wait_until,
    write_plan,
)

pytestmark = pytest.mark.fleet
__all__ = ["make_fleet"]

FLOWER_USER, FLOWER_PASSWORD = "lab", "flower-test-secret"


def _get(url: str, auth: bool = True) -> Any:
    """GET ``url`` from Flower (with basic auth unless told otherwise) as parsed JSON."""
    request = urllib.request.Request(url)
    if auth:
        token = base64.b64encode(f"{FLOWER_USER}:{FLOWER_PASSWORD}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def _answers(url: str) -> bool:
    """Whether Flower answers at ``url`` yet."""
    try:
        _get(url)
        return True
    except (urllib.error.URLError, ConnectionError):
        return False


def test_flower_api_lists_the_running_campaign_by_task_name(make_fleet: Any) -> None:
    """While a campaign runs, Flower's /api/tasks lists its environments by name, behind auth."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    port = free_port()
    env = fleet.env(fleet.coordinator_home, fleet.redis.url())
    env["SANDBENCH_FLOWER_AUTH"] = f"{FLOWER_USER}:{FLOWER_PASSWORD}"
    flower = fleet.spawn(
        [PYTHON, "-m", "coordinator", "flower", "--port", str(port)], env, "flower"
    )
    base = f"http://127.0.0.1:{port}"
    wait_until(
        lambda: _answers(f"{base}/api/workers?refresh=0") or not flower.alive(), 60, "Flower"
    )
    assert flower.alive(), flower.text()
    fleet.start_worker("lab-a")
    fleet.start_coordinator()
    plan = write_plan(fleet.root / "plan.toml", environments=3, rounds=1, workloads=["publish"],
                      modes=[slow_mode("slow", 2.0)])  # fmt: skip
    campaign = dispatch(fleet, plan, "lab-a")
    planned = {s.task_id for s in Store(fleet.data).load_campaign(campaign).specs}

    def listed() -> dict[str, Any]:
        tasks = _get(f"{base}/api/tasks?taskname=run_environment")
        return {k: v for k, v in tasks.items() if k in planned}

    def all_listed() -> dict[str, Any]:
        tasks = listed()
        return tasks if len(tasks) == len(planned) else {}

    seen = wait_until(all_listed, 60, "Flower to list every task")
    assert not status(fleet, campaign)["finished"], "the campaign should still be running"
    assert {t["name"] for t in seen.values()} == {"run_environment"}
    assert all("lab-a slow/publish #" in t["args"] for t in seen.values()), seen
    with pytest.raises(urllib.error.HTTPError) as denied:
        _get(f"{base}/api/tasks", auth=False)
    denied.value.close()
    assert denied.value.code == 401
    wait_finished(fleet, campaign)
