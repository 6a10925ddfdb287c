"""native mode: every workload passes at scale 0.02, and its preflight reports the interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.records import EnvironmentSpec
from worker.modes import HostInfo, get_mode
from worker.runner import run_environment
from workloads.registry import WORKLOADS

SCALE = 0.02


def test_preflight() -> None:
    """native's preflight passes and names the payload interpreter's version."""
    preflight = get_mode("native").preflight(HostInfo())
    assert preflight.ok and preflight.facts["python"].startswith("Python 3")


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_all_workloads_pass(modes_root: Path, workload: str) -> None:
    """Each workload passes natively: every round validated, exit 0, oracle matched."""
    spec = EnvironmentSpec(
        campaign="c-native", host="local", mode="native", workload=workload, env_index=0,
        scale=SCALE, work_root=str(modes_root),
    )  # fmt: skip
    record = run_environment(spec)
    assert record is not None and record.outcome == "passed", record and record.detail
    assert len(record.rounds) == 3 and record.oracle is not None and record.oracle.ok
