"""Flower watches the fleet: its API lists a running campaign's tasks by name, read-only, and
its task page shows each environment's outcome, failed ones found by one filter."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from coordinator.fleet.flower import FAILED_FILTER
from coordinator.store.store import Store
from tests.fleet_helpers import (
    PYTHON,
    Fleet,
    dispatch,
    free_port,
    make_fleet,
    records_of,
    slow_mode,
    status,
    wait_finished,
    wait_until,
    write_plan,
)
from tests.flower_view import ACTIONS, Browser, FlowerView
from worker.fleet import OUTCOME_TAG

pytestmark = pytest.mark.fleet
__all__ = ["make_fleet"]

FLOWER_USER, FLOWER_PASSWORD = "lab", "flower-test-secret"
QUIET_S = 3.0  # how long a refused action has to show any effect before we call it inert
# A command mode whose payload passes every round but whose launcher then exits 3.
EXITS_3 = {"name": "exits-3", "template": ["/bin/sh", "-c", '"$@"; exit 3', "exits-3",
                                            "{payload_argv}"]}  # fmt: skip
ROWS_JS = "Array.from(document.querySelectorAll('#tasks-table tbody tr')).map(r => r.innerText)"
SHOTS_ENV = "SANDBENCH_TEST_SHOTS"  # copy the screenshots here to look at them


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
    planned = {s.task_id: s for s in Store(fleet.data).load_campaign(campaign).specs}

    def all_listed() -> dict[str, Any]:
        tasks = {k: v for k, v in view.tasks().items() if k in planned}
        return tasks if len(tasks) == len(planned) else {}

    seen = wait_until(all_listed, 60, "Flower to list every task")
    assert not status(fleet, campaign)["finished"], "the campaign should still be running"
    assert {t["name"] for t in seen.values()} == {"run_environment"}
    for task_id, task in seen.items():  # sentinel environments too (native/sentinel-*)
        s = planned[task_id]
        assert task["args"] == f"lab-a {s.mode}/{s.workload} #{s.env_index}", task
    assert sum("lab-a slow/publish #" in t["args"] for t in seen.values()) == 3
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


def allow_command_modes(fleet: Fleet, host: str, names: list[str]) -> None:
    """The worker's own allowlist of command modes (a spec never decides that)."""
    (fleet.hosts[host].home / "worker.toml").write_text(
        f"allowed_command_modes = {json.dumps(names)}\n"
    )


def dark_share(shot: Path) -> float:
    """Share of the screenshot's pixels that are not near white (a blank page is ~0)."""
    gray = Image.open(shot).convert("L")
    histogram = gray.histogram()
    return sum(histogram[:200]) / (gray.width * gray.height)


def test_flower_shows_outcomes_and_one_filter_finds_the_failed(
    make_fleet: Any, tmp_path: Path
) -> None:
    """A cell whose launcher exits non-zero after its rounds: Flower's task page shows that task
    as failed (outcome, class/reason, host, mode/workload #i), the other environments as passed
    or not run, and typing outcome:failed in its search box leaves exactly the failed one."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    allow_command_modes(fleet, "lab-a", ["exits-3"])
    view = start_flower(fleet)
    fleet.start_worker("lab-a")
    fleet.start_coordinator()
    plan = write_plan(fleet.root / "plan.toml", environments=2, rounds=1, workloads=["publish"],
                      modes=["native", EXITS_3])  # fmt: skip
    campaign = dispatch(fleet, plan, "lab-a")
    wait_finished(fleet, campaign)
    specs = {s.task_id: s for s in Store(fleet.data).load_campaign(campaign).specs}
    records = {r.task_id: r for r in records_of(fleet, campaign, "lab-a")}
    failed = {t for t, r in records.items() if r.outcome == "failed"}
    assert len(failed) == 1 and records[next(iter(failed))].reason == "nonzero-exit"

    def all_done() -> dict[str, Any]:
        tasks = {k: v for k, v in view.tasks().items() if k in specs}
        done = len(tasks) == len(specs) and all(t["state"] == "SUCCESS" for t in tasks.values())
        return tasks if done else {}

    listed = wait_until(all_done, 60, "Flower to see every task succeed")
    for task_id, task in listed.items():  # arguments: the environment; result: its outcome
        r = records[task_id]
        assert task["args"] == f"{r.host} {r.mode}/{r.workload} #{r.env_index}", task["args"]
        assert task["result"].startswith(f"'{OUTCOME_TAG}{r.outcome}"), task["result"]
        assert ("(sentinel)" in task["result"]) == (r.kind == "sentinel")
    (failed_id,) = failed
    assert listed[failed_id]["result"].startswith(f"'{FAILED_FILTER} task/nonzero-exit: launcher")

    browser = Browser(tmp_path / "chromium-cdp")
    try:  # the environments' list, then the one filter typed into the search box
        auth = {"Authorization": view.auth_header()}
        browser.open(view.base + "/tasks?name=run_environment", auth)
        rows = browser.wait_for(f"{ROWS_JS}.length == {len(specs)} && {ROWS_JS}")
        every = browser.screenshot(tmp_path / "flower-environments.png")
        (shown,) = [row for row in rows if FAILED_FILTER in row]
        assert "lab-a exits-3/publish #" in shown and "task/nonzero-exit" in shown
        browser.open(view.base + "/tasks", auth)
        browser.wait_for(f"{ROWS_JS}.length > 0")
        browser.type_into("#tasks-table_filter input", FAILED_FILTER)  # replaces what was there
        found = browser.wait_for(f"{ROWS_JS}.length == 1 && {ROWS_JS}")
        info = browser.js("document.querySelector('#tasks-table_info').innerText")
        filtered = browser.screenshot(tmp_path / "flower-failed.png")
    finally:
        browser.close()
    assert FAILED_FILTER in found[0] and "task/nonzero-exit" in found[0] and failed_id in found[0]
    total = int(info.rpartition("filtered from ")[2].split()[0])  # every task Flower has seen
    assert info.startswith("Showing 1 to 1 of 1 tasks") and total > len(specs), info
    for shot in (every, filtered):
        assert dark_share(shot) > 0.01, f"{shot} looks blank"
        if shots := os.environ.get(SHOTS_ENV):
            shutil.copy(shot, Path(shots) / shot.name)
