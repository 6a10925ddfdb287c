"""Benchmark scripts run as written and report failures through their exit status."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO


def run_script(name: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``benchmarks/<name>`` with this interpreter; its completed process."""
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / name), *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, **env}, check=False,
    )  # fmt: skip


def test_workloads_native_passes() -> None:
    """workloads_native.py exits 0 when every environment passes."""
    done = run_script("workloads_native.py", "--scale", "0.02", "publish")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "match" in done.stdout


def test_workloads_native_fails_loudly() -> None:
    """workloads_native.py exits 1 and names the environment when one fails."""
    done = run_script(
        "workloads_native.py", "--scale", "0.02", "publish", SANDBENCH_PYTHON="/bin/false"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED environments: publish" in done.stdout
