"""The workload registry and ``sandbench workloads list``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contract.errors import WorkloadError
from workloads.registry import GROUPS, WORKLOADS, get_workload, resolve

REPO = Path(__file__).resolve().parents[1]
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DESIGN = [  # the design's table: name, group, the parameters it states
    ("seq-write", "mechanism", {"file_bytes": 4 * MiB, "write_bytes": 64 * KiB}),
    ("sync-write", "mechanism", {"total_bytes": MiB, "write_bytes": 4 * KiB}),
    ("create-small", "mechanism", {"files": 1024, "dirs": 32, "file_bytes": 4 * KiB}),
    ("read-small", "mechanism", {"files": 2048, "dirs": 32}),
    ("stat-tree", "mechanism", {"files": 2048, "passes": 4}),
    ("readdir-wide", "mechanism", {"entries": 8192, "passes": 8}),
    ("read-large", "mechanism", {"file_bytes": 64 * MiB}),
    ("rename-atomic", "mechanism", {"renames": 512, "file_bytes": 4 * KiB}),
    ("append-fsync", "mechanism", {"records": 4096, "record_bytes": 256, "fsync_every": 64}),
    ("delete-tree", "mechanism", {"files": 1024}),
    ("mmap-write", "mechanism", {"file_bytes": 16 * MiB}),
    ("copy-tree", "mechanism", {"files": 2048}),
    ("ws64-w1", "resource", {"logical_bytes": GiB, "working_set_bytes": 64 * MiB, "writers": 1}),
    ("ws256-w1", "resource", {"logical_bytes": GiB, "working_set_bytes": 256 * MiB, "writers": 1}),
    ("ws1024-w1", "resource", {"logical_bytes": GiB, "working_set_bytes": GiB, "writers": 1}),
    ("ws256-w4", "resource", {"logical_bytes": GiB, "working_set_bytes": 256 * MiB, "writers": 4}),
    ("repo-inspect", "workflow", {"files": 2048, "commits": 200}),
    ("incremental-build", "workflow", {"units": 64, "jobs": 2}),
    ("publish", "workflow", {"files": 256, "file_bytes": 16 * KiB}),
]  # fmt: skip


def test_cli_list_json() -> None:
    """``workloads list --json`` prints exactly the design's 19 names, groups and parameters."""
    r = subprocess.run(
        [sys.executable, "-m", "coordinator", "workloads", "list", "--json"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(row["name"], row["group"]) for row in rows] == [(n, g) for n, g, _ in DESIGN]
    assert [row["number"] for row in rows] == list(range(1, len(DESIGN) + 1))
    for row, (_, _, stated) in zip(rows, DESIGN, strict=True):
        assert stated.items() <= row["params"].items(), row["name"]
        if row["group"] == "resource":  # logical 1 GiB over 4 files
            assert row["params"]["files"] == 4


def test_cli_list_table() -> None:
    """``workloads list`` prints one line per workload with its group."""
    r = subprocess.run(
        [sys.executable, "-m", "coordinator", "workloads", "list"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    for name, group, _ in DESIGN:
        assert any(name in line and group in line for line in r.stdout.splitlines()), name


def test_groups() -> None:
    """Groups hold 12 mechanism, 4 resource and 3 workflow workloads in table order."""
    assert {g: len(names) for g, names in GROUPS.items()} == {
        "mechanism": 12, "resource": 4, "workflow": 3,
    }  # fmt: skip
    assert [w for group in GROUPS.values() for w in group] == list(WORKLOADS)


def test_get_workload_suggests() -> None:
    """An unknown name raises WorkloadError with a did-you-mean suggestion."""
    with pytest.raises(WorkloadError, match="did you mean 'seq-write'"):
        get_workload("seqwrite")


def test_resolve() -> None:
    """resolve expands groups and 'all', keeps first-seen order and drops repeats."""
    assert resolve(["all"]) == list(WORKLOADS)
    assert resolve(["publish", "workflow"]) == ["publish", "repo-inspect", "incremental-build"]
    assert resolve(["resource"]) == ["ws64-w1", "ws256-w1", "ws1024-w1", "ws256-w4"]
    with pytest.raises(WorkloadError, match="did you mean 'workflow'"):
        resolve(["workflw"])


def test_workload_attributes() -> None:
    """Every workload has a number, a one-line summary and scale-1.0 parameters."""
    for i, (name, w) in enumerate(WORKLOADS.items(), start=1):
        assert (w.name, w.number) == (name, i)
        assert w.summary and "\n" not in w.summary
        assert w.params(1.0) == w.full_params


def test_bad_scale_and_rounds() -> None:
    """A scale outside (0, 1] or too many rounds is a WorkloadError saying the range."""
    with pytest.raises(WorkloadError, match=r"\(0, 1\]"):
        get_workload("publish").params(0)
    with pytest.raises(WorkloadError, match="rounds must be"):
        get_workload("publish").model(1, 0.02, 99)
