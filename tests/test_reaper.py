"""The reaper and ``sandbench host clean``: leftovers of dead environments go, live ones stay."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, require, require_binary
from tests.fleet_helpers import (
    assert_each_once,
    dispatch,
    make_fleet,
    remove_leftover_cgroups,
    slow_mode,
    wait_finished,
    wait_until,
    write_plan,
)
from tests.leftovers import (
    NOTHING,
    cgroup_dirs,
    cgroup_pids,
    env_names,
    hold,
    holding,
    holding_python,
    leftovers,
    mounts_under,
    release,
    runs,
)
from worker import ledger
from worker.cgroups import cgroup_mounts, detect
from worker.cgroups.v1 import CONTROLLERS, REQUIRED

__all__ = ["make_fleet"]  # the fixture, re-used from fleet_helpers
REAP_BOUND_S = 120  # a two-host campaign with a worker killed, restarted and its message back


def _sandbench(*args: str, env: dict[str, str], **popen: Any) -> subprocess.Popen[str]:
    """Start ``sandbench ARGS`` as the operator would."""
    return subprocess.Popen(
        [sys.executable, "-m", "coordinator", *args], cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen,
    )  # fmt: skip


def _clean(work_root: Path, env: dict[str, str]) -> dict[str, Any]:
    """``sandbench host clean --work-root W --json``: exit 0 and its JSON."""
    done = _sandbench("host", "clean", "--work-root", str(work_root), "--json", env=env)
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, out + err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of every sandbench process here: a private home, the holding python."""
    require(os.geteuid() == 0, "root (cgroups and overlay mounts)")
    home = tmp_path / "home"
    home.mkdir()
    python = holding_python(tmp_path)
    return {**os.environ, "SANDBENCH_HOME": str(home), "SANDBENCH_PYTHON": str(python)}


def _staged(work_root: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """A staged environment on ``work_root`` (it holds as ``hold`` says)."""
    work_root.mkdir(exist_ok=True)
    return _sandbench(
        "env", "run", "--mode", "staged", "--workload", "publish", "--scale", "0.02",
        "--rounds", "1", "--limit-s", "120", "--work-root", str(work_root), "--json", env=env,
    )  # fmt: skip


def test_host_clean_reaps_a_killed_staged_environment_and_spares_a_live_one(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """A runner killed mid-environment leaves a mount, cgroups in every v1 hierarchy,
    processes, a workspace: ``host clean`` removes each, while another work root's live
    environment (and ``host clean`` of its own root) leaves that one running to a pass."""
    dead_root, live_root = tmp_path / "work-dead", tmp_path / "work-live"
    for root in (dead_root, live_root):
        root.mkdir()
        hold(root, 600)
    live = _staged(live_root, env)
    dead = _staged(dead_root, env)
    dead_name, live_name = holding(dead_root), holding(live_root)
    if detect() == 1:
        mounts = cgroup_mounts()
        for controller in REQUIRED:
            assert (mounts[controller] / "sandbench" / dead_name).is_dir(), controller
    dead.send_signal(signal.SIGKILL)
    dead.communicate(timeout=30)
    before = leftovers(dead_root, dead_name)
    assert before["processes"] and before["cgroups"] and before["mounts"], before

    spared = _clean(live_root, env)
    assert spared["reaped"] == [] and spared["skipped"] == [live_name], spared
    result = _clean(dead_root, env)
    kinds = [item["kind"] for item in result["reaped"]]
    assert {"process", "cgroup", "mount", "workspace"} <= set(kinds), result
    assert kinds.count("cgroup") >= len(before["cgroups"]), result  # v2: and the launcher leaf
    assert leftovers(dead_root, dead_name) == NOTHING
    assert result["problems"] == [] and result["skipped"] == []
    assert live.poll() is None and (live_root / "envs" / live_name / "env/stage/merged").is_mount()
    release(live_name)
    out, err = live.communicate(timeout=120)
    assert live.returncode == 0 and json.loads(out)["outcome"] == "passed", out + err
    assert _clean(dead_root, env)["reaped"] == []  # nothing left the second time


def test_an_entry_whose_creator_lives_is_left_alone_until_it_dies(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """A ledger entry of a live process keeps its mount; once that process is gone, both go."""
    root = tmp_path / "work"
    name = "c-reaper-live-abc123"
    merged = root / "envs" / name / "env" / "stage" / "merged"
    merged.mkdir(parents=True)
    creator = subprocess.Popen(["sleep", "300"])
    try:
        entry = ledger.Entry(name, f"c/{name}", f"/sandbench/{name}", detect(), creator.pid,
                             ledger.process_start(creator.pid), 0.0)  # fmt: skip
        (root / "owned").mkdir()
        (root / "owned" / f"{name}.json").write_text(json.dumps(entry.__dict__))
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "sbtest", str(merged)], check=True)
        assert _clean(root, env)["skipped"] == [name] and merged.is_mount()
    finally:
        creator.kill()
        creator.wait()
    result = _clean(root, env)
    assert [i["kind"] for i in result["reaped"]] == ["mount", "workspace"], result
    assert not merged.parent.exists() and not list((root / "owned").iterdir())


@pytest.mark.fleet
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
    hold(b, 600)
    fleet.register_hosts()
    worker = fleet.start_worker("lab-a")
    fleet.start_worker("lab-b")
    fleet.start_coordinator()
    plan = write_plan(fleet.root / "plan.toml", environments=1, rounds=1, workloads=["publish"],
                      modes=["staged"], limit_s=60, sentinel=False)  # fmt: skip
    campaign = dispatch(fleet, plan, "lab-a,lab-b")
    try:
        killed, running = holding(a), holding(b)
        groups = cgroup_dirs(killed)
        if detect() == 1:  # the environment's cgroup is in every v1 controller's hierarchy
            mounts = cgroup_mounts()
            assert {mounts[c] for c in CONTROLLERS if c in mounts} <= {g.parents[1] for g in groups}
        strays, others = cgroup_pids(groups), cgroup_pids(cgroup_dirs(running))
        worker.kill9()
        hold(a, 0)
        assert all(runs(p) for p in strays) and mounts_under(a)
        restarted = fleet.start_worker("lab-a")
        assert killed not in env_names(a) and cgroup_dirs(killed) == []
        assert not [m for m in mounts_under(a) if killed in m]
        assert not [p for p in strays if runs(p)]
        assert (b / "envs" / running / "env" / "stage" / "merged").is_mount()
        assert cgroup_dirs(running) and all(runs(p) for p in others)
        release(running)
        wait_finished(fleet, campaign, REAP_BOUND_S)
    finally:
        remove_leftover_cgroups(campaign)
    log = restarted.own_text()
    assert f"reaper: reaped mount {a}/envs/{killed}/env/stage/merged" in log, log
    assert log.index("reaper: reaped") < log.index("Task run_environment[")
    for name in fleet.hosts:
        (record,) = assert_each_once(fleet, campaign, name)
        assert record.outcome == "passed", record.detail
    assert leftovers(a, campaign) == leftovers(b, campaign) == NOTHING


@pytest.mark.fleet
def test_a_worker_reaps_right_after_an_environment_whose_cleanup_failed(make_fleet: Any) -> None:
    """A mode whose cleanup fails (and leaves a directory behind) keeps its ledger entry; the
    worker reaps at once: the stray directory and the entry are gone, the reaping logged."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    worker = fleet.start_worker("lab-a")
    fleet.start_coordinator()
    messy = {**slow_mode("slow", 0.1), "cleanup": "mkdir {env_dir}/../../stray && exit 1"}
    plan = write_plan(fleet.root / "plan.toml", environments=1, rounds=1, workloads=["publish"],
                      modes=[messy], sentinel=False)  # fmt: skip
    campaign = dispatch(fleet, plan, "lab-a")
    wait_finished(fleet, campaign, REAP_BOUND_S)
    (record,) = assert_each_once(fleet, campaign, "lab-a")
    assert "mode cleanup" in str(record.provenance.get("cleanup")), record.provenance
    work_root = fleet.hosts["lab-a"].work_root
    assert "reaped workspace " + str(work_root / "envs" / "stray") in worker.own_text()
    assert leftovers(work_root, campaign) == NOTHING


@pytest.fixture
def docker_dir() -> Iterator[Path]:
    """A private dockerd's state directory (short: unix socket paths are limited)."""
    require_binary("dockerd")
    from worker.dockerd import Dockerd

    path = Path(tempfile.mkdtemp(prefix="sbrp-", dir="/tmp"))
    yield path
    Dockerd(state_dir=path).purge()


@pytest.mark.docker
def test_host_clean_removes_its_labelled_containers_only(
    tmp_path: Path, env: dict[str, str], docker_dir: Path
) -> None:
    """A labelled container bound to this work root's environment is removed; one bound to
    another work root, and an unlabelled one, stay."""
    from worker.dockerd import Dockerd
    from worker.modes.container import LABEL_KEY, toolset_mounts
    from worker.modes.docker import ensure_image

    daemon = Dockerd(state_dir=docker_dir)
    daemon.start()
    image = ensure_image(daemon)["image"]
    ours, theirs = tmp_path / "work", tmp_path / "other-work"
    ids = {}
    for label, root in (("ours", ours), ("theirs", theirs), (None, ours)):
        workspace = root / "envs" / f"c-docker-{label}" / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        labels = [f"--label={LABEL_KEY}=c/{label}"] if label else []
        ids[label] = daemon.run(
            "run", "--detach", "--network=none", *labels, *toolset_mounts(),
            f"--mount=type=bind,src={workspace},dst=/ws", image, "/bin/sleep", "300",
        ).strip()  # fmt: skip
    result = _clean(ours, {**env, "SANDBENCH_DOCKER_DIR": str(docker_dir)})
    reaped = [i for i in result["reaped"] if i["kind"] == "docker-container"]
    assert len(reaped) == 1 and "c-docker-ours" in reaped[0]["what"], result
    running = set(daemon.run("ps", "--quiet", "--no-trunc").split())
    assert ids["ours"] not in running and {ids["theirs"], ids[None]} <= running


@pytest.mark.vm
def test_host_clean_kills_a_qemu_by_its_pid_file(tmp_path: Path, env: dict[str, str]) -> None:
    """A QEMU whose pid file is in a dead environment is killed; a pid file naming a process
    that is not that QEMU, and another work root's QEMU, are left alone."""
    qemu = require_binary("qemu-system-x86_64")
    ours, theirs = tmp_path / "work", tmp_path / "other-work"
    procs = {}
    for root in (ours, theirs):
        pidfile = root / "envs" / "c-vm-0" / "env" / "qemu.pid"
        pidfile.parent.mkdir(parents=True)
        argv = [qemu, "-machine", "none", "-nodefaults", "-display", "none", "-S",
                "-pidfile", str(pidfile)]  # fmt: skip
        procs[root] = subprocess.Popen(argv, start_new_session=True)
        wait_until(pidfile.exists, 30, "QEMU's pid file")
    bystander = subprocess.Popen(["sleep", "300"])
    stale = ours / "envs" / "c-vm-1" / "env" / "qemu.pid"
    stale.parent.mkdir(parents=True)
    stale.write_text(f"{bystander.pid}\n")  # a pid reused by a process that is not a VM
    try:
        result = _clean(ours, env)
        killed = [i["what"] for i in result["reaped"] if i["kind"] == "process"]
        assert len(killed) == 1 and "qemu-system-x86_64" in killed[0], result
        assert procs[ours].wait(timeout=10) == -signal.SIGKILL
        assert procs[theirs].poll() is None and bystander.poll() is None
        assert not (ours / "envs").exists() or not list((ours / "envs").iterdir())
    finally:
        for proc in (*procs.values(), bystander):
            proc.kill()
            proc.wait()
