"""The working-set workloads fit the design's 2 GiB memory quota (page cache is charged)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require
from workloads import fixtures, oracle
from workloads.drive import drive
from workloads.registry import GROUPS, get_workload

MEMORY = Path("/sys/fs/cgroup/memory")
LIMIT = 2 << 30  # the design's quota: 2 GiB, no swap
JOIN = 'echo $$ > "$0/cgroup.procs" && exec "$@"'  # the launcher enters the cgroup, then execs


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A private cgroup v1 memory group limited to 2 GiB of memory plus swap."""
    require(os.geteuid() == 0 and (MEMORY / "memory.memsw.limit_in_bytes").exists(),
            "root and a cgroup v1 memory hierarchy with swap accounting")  # fmt: skip
    group = MEMORY / f"sandbench-test-ws-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(LIMIT))
        (group / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
        yield group
    finally:
        group.rmdir()  # the payload has exited: its page cache charge moves to the parent


@pytest.mark.slow
@pytest.mark.parametrize("name", GROUPS["resource"])
def test_working_set_under_quota(name: str, memory_cgroup: Path, tmp_path: Path) -> None:
    """At scale 1.0 a working-set workload passes 3 rounds in a 2 GiB cgroup without OOM."""
    fixture = fixtures.ensure_fixture(name, 1, 1.0, tmp_path / "cache")
    fixtures.copy_fixture(fixture, tmp_path / "ws")
    result = drive(
        name, 1, 1.0, tmp_path / "ws", [1, 2, 3], ("/bin/sh", "-c", JOIN, str(memory_cgroup))
    )
    assert result.ok, (result.lines, result.stderr)
    assert "oom_kill 0" in (memory_cgroup / "memory.oom_control").read_text()
    peak = int((memory_cgroup / "memory.max_usage_in_bytes").read_text())
    assert 64 << 20 < peak <= LIMIT  # charged (so it ran inside), and within the quota
    model = get_workload(name).model(1, 1.0, 3, fixture=fixture)
    assert oracle.compare(tmp_path / "ws", model) == []
