"""The quota binds: work that runs outside the environment's cgroup fails as quota-escaped."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import require_binary

from contract.records import REASONS, EnvironmentRecord, EnvironmentSpec
from worker import containment
from worker.cgroups import cgroup_mounts, detect
from worker.cgroups.v1 import REQUIRED
from worker.runner import run_environment

TIMES_RESOLUTION_S = 0.002  # bash's ``times``: user and system, each truncated to the ms


def _root_procs() -> str:
    """The root cgroup's ``cgroup.procs`` of every hierarchy the quota uses, space-separated."""
    mounts = cgroup_mounts()
    if detect() == 2:
        return str(mounts["cgroup2"] / "cgroup.procs")
    points = dict.fromkeys(mounts[name] for name in REQUIRED)
    return " ".join(str(point / "cgroup.procs") for point in points)


def _run(root: Path, mode: str, workload: str, template: str | list[str]) -> EnvironmentRecord:
    """One environment of a command mode with ``template``."""
    spec = EnvironmentSpec(
        campaign="c-contain", host="local", mode=mode, workload=workload, env_index=0,
        scale=0.02, work_root=str(root), mode_options={"template": template},
    )  # fmt: skip
    record = run_environment(spec)
    assert record is not None
    return record


def test_the_reason_is_a_resource_failure() -> None:
    """quota-escaped is one of the design's resource reasons."""
    assert REASONS["quota-escaped"] == "resource"


def test_native_passes_both_checks(work_root: Path) -> None:
    """A native environment passes, and its cgroup saw at least the CPU time the payload reports
    it used after joining (its own count also holds the launch shim's start before the join,
    which no cgroup of the environment sees: ``prejoin_cpu_s``, as bash's ``times`` printed it)."""
    spec = EnvironmentSpec(
        campaign="c-contain", host="local", mode="native", workload="incremental-build",
        env_index=0, scale=0.02, work_root=str(work_root),
    )  # fmt: skip
    record = run_environment(spec)
    assert record is not None and record.outcome == "passed", record and record.detail
    assert record.payload_cpu_s is not None and record.cpu_s is not None
    prejoin = record.provenance["prejoin_cpu_s"]
    assert 0 <= prejoin < record.payload_cpu_s
    # bash's ``times`` truncates its user and system times to the millisecond each
    assert record.payload_cpu_s - prejoin <= record.cpu_s + TIMES_RESOLUTION_S


def test_a_template_that_moves_the_payload_to_the_root_cgroup_is_caught(work_root: Path) -> None:
    """A launcher that writes its own PID into the root cgroup fails the placement check."""
    template = f"for f in {_root_procs()}; do echo $$ > $f; done; exec {{payload_argv}}"
    record = _run(work_root, "escape-root", "publish", template)
    assert (record.outcome, record.failure_class, record.reason) == (
        "failed", "resource", "quota-escaped"
    ), record.detail  # fmt: skip
    assert record.detail and "placement check after Ready" in record.detail
    assert "outside its cgroup" in record.detail and record.rounds == []


def test_work_handed_to_a_process_outside_the_tree_is_caught(work_root: Path) -> None:
    """A payload double-forked out of the tree into the root cgroup fails the CPU-time check."""
    pid_file = "{env_dir}/payload.pid"
    template = (
        f"exec 3<&0; ( sh -c 'for f in {_root_procs()}; do echo $$ > $f; done; exec \"$@\"' "
        f"payload {{payload_argv}} <&3 & echo $! > {pid_file} ); "
        f"while kill -0 $(cat {pid_file}) 2>/dev/null; do sleep 0.05; done"
    )
    record = _run(work_root, "escape-fork", "incremental-build", template)
    assert (record.failure_class, record.reason) == ("resource", "quota-escaped"), record.detail
    assert record.detail and record.detail.startswith("CPU-time check")
    assert record.payload_cpu_s is not None and record.cpu_s is not None
    assert record.cpu_s < 0.9 * record.payload_cpu_s
    assert len(record.rounds) == 3, "the rounds ran; only the quota did not bind"


def test_the_gvisor_do_template_escapes_and_is_caught(work_root: Path) -> None:
    """``runsc do`` (the old README template) runs its sandbox outside the cgroup: caught."""
    runsc = require_binary("runsc")
    template = [runsc, "--network=none", "--platform=ptrace", "do", "-force-overlay=false",
                "-cwd", "{workspace}", "{payload_argv}"]  # fmt: skip
    record = _run(work_root, "gvisor-do", "incremental-build", template)
    assert (record.failure_class, record.reason) == ("resource", "quota-escaped"), record.detail
    print(f"runsc do: {record.detail}")


@pytest.mark.parametrize(
    ("cgroup_s", "payload_s", "escaped"),
    [(0.034, 1.55, True), (0.316, 0.30, False), (0.0, 0.04, False), (1.0, 1.05, False),
     (0.5, 1.0, True), (None, 1.0, False)],
)  # fmt: skip
def test_the_cpu_share_rule(cgroup_s: float | None, payload_s: float, escaped: bool) -> None:
    """Below 90% of the payload's own CPU time (and 50 ms less) is an escape; noise is not."""
    problem = containment.cpu_problem(cgroup_s or 0.0, payload_s if cgroup_s is not None else None,
                                      0.9)  # fmt: skip
    assert (problem is not None) == escaped, problem


def test_the_cpu_spent_before_joining_is_not_held_against_the_cgroup() -> None:
    """The v2 guest's native record (TCG): the shim's start before its join (tens of ms there)
    is in the payload's own count and in no cgroup; without it taken off, a quota that bound
    read as escaped. Taking it off still leaves a real escape caught."""
    assert containment.cpu_problem(0.515, 0.588, 0.9) is not None, "the old rule failed it"
    assert containment.cpu_problem(0.515, 0.588, 0.9, 0.07) is None
    detail = containment.cpu_problem(0.034, 1.55, 0.9, 0.07)
    assert detail is not None and "0.070 s of it before joining" in detail


def test_the_tree_walk_finds_what_a_scan_of_every_process_finds() -> None:
    """The placement check's walk through the kernel's children files finds the same tree as
    psutil's scan of every process: children of the main thread and of another thread, a
    grandchild of a shell; [] once the root is gone."""
    script = (
        "import subprocess, sys, threading, time\n"
        "kids = []\n"
        "t = threading.Thread(target=lambda: kids.append(subprocess.Popen(['sleep', '30'])))\n"
        "t.start(); t.join()\n"
        "kids.append(subprocess.Popen(['sh', '-c', 'sleep 30 & sleep 30']))\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "print('up', flush=True); sys.stdin.read()\n"
        "for k in kids: k.kill()\n"
    )
    with subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as proc:  # fmt: skip
        assert proc.stdout and proc.stdout.readline() == "up\n"
        root = psutil.Process(proc.pid)
        deadline = time.monotonic() + 10
        while len(root.children(recursive=True)) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)  # the shell starts its two sleeps
        scanned = sorted([proc.pid, *(p.pid for p in root.children(recursive=True))])
        assert len(scanned) == 5, scanned
        assert sorted(containment.tree(proc.pid)) == scanned
        assert proc.stdin
        proc.stdin.close()
    assert containment.tree(proc.pid) == []
