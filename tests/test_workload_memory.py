"""The working-set workloads fit the design's 2 GiB memory quota (page cache is charged)."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.records import EnvironmentSpec, Quota
from worker.runner import run_environment
from workloads.registry import GROUPS

LIMIT = 2 << 30  # the design's quota: 2 GiB, no swap


@pytest.mark.slow
@pytest.mark.parametrize("name", GROUPS["resource"])
def test_working_set_under_quota(name: str, tmp_path: Path) -> None:
    """At scale 1.0 a working-set workload passes 3 rounds in a 2 GiB cgroup without OOM."""
    spec = EnvironmentSpec(
        campaign="c-ws", host="local", mode="native", workload=name, env_index=0, seed=1,
        scale=1.0, quota=Quota(memory_bytes=LIMIT, swap_bytes=0), work_root=str(tmp_path),
    )  # fmt: skip
    record = run_environment(spec)  # the runner's cgroup (v1 or v2) carries the quota
    assert record is not None and record.outcome == "passed", record and record.detail
    assert record.oracle is not None and record.oracle.ok
    peak = record.peak_memory_bytes
    assert peak is not None and 64 << 20 < peak <= LIMIT  # charged (ran inside), within quota
