"""The runner: a passing record, the quota, and failures test_faults does not inject."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from contract.records import REASONS, EnvironmentRecord, EnvironmentSpec, Quota
from worker.runner import PHASES, STEPS, run_environment
from workloads.fixtures import ensure_fixture
from workloads.registry import Models, get_workload


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work root shared by this module's environments (fixtures are built once)."""
    return tmp_path_factory.mktemp("runner-work")


def run(
    root: Path, workload: str = "seq-write", *, mode: str = "native", **fields: Any
) -> EnvironmentRecord:
    """Run one environment and check what every record must satisfy."""
    options = fields.pop("options", {})
    if "template" in fields:
        options["template"] = fields.pop("template")
        mode = "command"
    spec = EnvironmentSpec(
        campaign="c-test", host="local", mode=mode, workload=workload, env_index=0,
        scale=fields.pop("scale", 0.02), work_root=str(root), mode_options=options, **fields,
    )  # fmt: skip
    record = run_environment(spec)
    assert record is not None
    assert all(r.task_s > 0 for r in record.rounds), "a round time of zero"
    assert not list((root / "envs").iterdir()), "environment files left behind"
    if record.outcome == "failed":
        assert record.failure_class == REASONS[record.reason or ""]
        assert record.detail
    return record


def assert_failed(record: EnvironmentRecord, reason: str) -> None:
    """The record failed with ``reason`` (showing its detail otherwise)."""
    assert (record.outcome, record.reason) == ("failed", reason), record.detail


def test_passing_record_has_every_field(root: Path) -> None:
    """A passing native environment fills Ready, rounds, exit, oracle, accounting and provenance."""
    record = run(root, "create-small")
    assert record.outcome == "passed", record.detail
    assert record.ready_ms is not None and 0 < record.ready_ms < 5000
    assert [r.k for r in record.rounds] == [1, 2, 3] and all(r.validated for r in record.rounds)
    assert record.exit_code == 0 and record.oracle is not None and record.oracle.ok
    assert record.cpu_s is not None and record.cpu_s > 0
    assert record.peak_memory_bytes is not None and record.peak_memory_bytes > 1 << 20
    assert record.started_at is not None and record.started_at.endswith("Z")
    assert record.provenance["preflight"]["ok"] and record.provenance["cgroup_version"] in (1, 2)


def test_launcher_error_through_a_shell(root: Path) -> None:
    """A shell template whose program is missing (exit 127 before Ready) is launcher-error too."""
    assert_failed(run(root, template="/nonexistent/runtime {payload_argv}"), "launcher-error")


def test_round_error(root: Path) -> None:
    """A round that raises (its input file was removed) is round-error, with the message."""
    record = run(root, "read-large", template="rm {workspace}/large.bin && exec {payload_argv}")
    assert_failed(record, "round-error")
    assert "large.bin" in (record.detail or "") and record.rounds == []


def test_timeout_kills_the_tree_and_cleans_up(root: Path) -> None:
    """Past the limit the whole tree (even a detached child) is killed and the workspace removed."""
    marker = "61.77"
    template = f"{{payload_argv}}; setsid sleep {marker} & sleep {marker}"
    record = run(root, template=template, limit_s=2.0)
    assert_failed(record, "timeout")
    assert len(record.rounds) == 3
    left = [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
    assert left == []


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs as the work root, unmounted afterwards."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_no_space(small_tmpfs: Path) -> None:
    """Writing 4 MiB into a work root on a 2 MiB tmpfs is no-space."""
    record = run(small_tmpfs, "seq-write", scale=1.0)
    assert_failed(record, "no-space")
    assert record.failure_class == "resource"


BUSY_THEN_PAYLOAD = (
    "{python} -I -S -c 'import hashlib, threading, time\n"
    "def spin():\n"
    "    while True: hashlib.sha256(bytes(1 << 20)).digest()\n"
    "[threading.Thread(target=spin, daemon=True).start() for _ in range(4)]\n"
    "time.sleep(2)' && exec {payload_argv}"
)


def test_environment_quota_caps_cpu(root: Path) -> None:
    """The environment's whole tree is capped by its quota: 4 busy threads, 0.5 core, 2 s."""
    record = run(root, template=BUSY_THEN_PAYLOAD, quota=Quota(cpus="0", cpu_quota=0.5))
    assert record.outcome == "passed", record.detail
    assert record.cpu_s is not None and 0.2 < record.cpu_s <= 0.5 * 2.0 * 1.1 + 0.2


def test_phases_account_for_the_environments_wall_time(root: Path) -> None:
    """Preparation, drive, oracle and cleanup are timed apart and add up to the wall time."""
    record = run(root, "copy-tree")
    phases = record.model_extra["phases"] if record.model_extra else {}
    assert set(phases) == {"prepare_s", "drive_s", "oracle_s", "cleanup_s"}
    assert all(seconds > 0 for seconds in phases.values()), phases
    measured = (record.ready_ms or 0) / 1000 + sum(r.task_s for r in record.rounds)
    assert phases["drive_s"] > measured  # the drive also holds the checks and the exit
    assert record.wall_s is not None
    assert 0.9 * record.wall_s < sum(phases.values()) <= record.wall_s


def test_steps_lie_inside_their_phases(root: Path) -> None:
    """Each step's seconds are counted inside its phase, and the main ones are there."""
    record = run(root, "copy-tree", mode="staged")
    extra = record.model_extra or {}
    phases, steps = extra["phases"], extra["steps"]
    assert set(steps) <= {f"{s}_s" for s in STEPS}
    for step in ("prepare.copy", "prepare.sync", "prepare.snapshot", "drive.join", "drive.checks",
                 "drive.placement", "drive.exit", "oracle.model", "oracle.compare",
                 "cleanup.remove"):  # fmt: skip
        assert steps.get(f"{step}_s", 0) > 0, (step, steps)
    for phase in PHASES:
        inside = sum(s for name, s in steps.items() if name.startswith(f"{phase}."))
        assert inside <= phases[f"{phase}_s"] + 1e-5, (phase, inside, phases)


def test_a_model_is_computed_once_and_still_checks_every_environment(root: Path) -> None:
    """Kept models serve the next environment of the same (workload, seed, scale, rounds) and
    fixture; the oracle still compares each final state (a wrong one still fails)."""
    models = Models()
    spec = EnvironmentSpec(campaign="c-test", host="local", mode="native", workload="publish",
                           env_index=0, scale=0.02, work_root=str(root))  # fmt: skip
    first = run_environment(spec, models=models)
    again = run_environment(spec.model_copy(update={"env_index": 1}), models=models)
    assert first is not None and again is not None
    assert first.outcome == again.outcome == "passed"
    assert len(models._kept) == 1  # one model served both
    model = next(iter(models._kept.values()))
    rel, state = next(iter(model.files.items()))
    model.files[rel] = type(state)(state.size + 1, state.sha256)  # a model now wrong on one file
    wrong = run_environment(spec.model_copy(update={"env_index": 2}), models=models)
    assert wrong is not None and wrong.reason == "oracle-mismatch", wrong
    assert f"size: {rel}" in (wrong.detail or "")


def test_a_model_asked_by_two_threads_at_once_is_computed_once(tmp_path: Path) -> None:
    """An environment prepared ahead computes its model while the oracle of the one before may
    ask for the same: the second waits for the first's, nothing is computed twice."""
    real = get_workload("publish")
    calls: list[float] = []

    class Counting:  # the real workload's model, counted and made slow enough to collide
        name, ignore = real.name, real.ignore

        def model(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(time.monotonic())
            time.sleep(0.5)
            return real.model(*args, **kwargs)

    fixture = ensure_fixture("publish", 1, 0.02, tmp_path / "fixtures")  # no model kept on disk
    models = Models()
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda _: models.model(Counting(), 1, 0.02, 3, fixture), range(2)))  # type: ignore[arg-type]
    assert len(calls) == 1 and got[0] is got[1]
