"""What the runner adds: native round times through the runner vs. a bare loop, and Ready per mode.

For each workload, environments alternate between the runner (cgroup, channel with deadlines,
mode sync, records) and a bare loop that spawns the same payload on the same fresh workspace
and times ``round k`` -> ``done k`` with a blocking readline (checks and input preparation
outside the clock, as the runner does). The bare loop runs twice: inside
a cgroup with the same quota (so ``runner / bare-cg`` isolates the harness: channel, clocks,
sync) and with no cgroup at all (``bare-cg / bare`` shows what CFS group scheduling costs on
a busy host: a cgroup competes as one entity against every other runnable task; on an idle
host it is ~1). Ratios are of the medians of environment task times (sum of R rounds).
Then Ready (marker -> ready line) per mode, min / median / max over a few environments.

Usage: .venv/bin/python benchmarks/runner_overhead.py [--scale 0.1] [--envs 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from tasks.records import EnvironmentSpec, Quota
from worker import quota
from worker.modes.base import PAYLOAD_PATH, PAYLOAD_PYTHON
from worker.runner import run_environment
from workloads.fixtures import copy_fixture, ensure_fixture
from workloads.registry import WORKLOADS

READY_MODES = {
    "native": {},
    "host": {},
    "staged": {},
    "command": {"template": ["nice", "-n", "0", "{payload_argv}"]},
}
READY_WORKLOAD = "seq-write"


def bare_rounds(
    workload: str, seed: int, scale: float, rounds: int, root: Path, in_cgroup: bool
) -> list[float]:
    """Round times of the payload driven by a plain loop (no deadlines, no sync, no record)."""
    group = quota.create(quota.cgroup_name("bench-bare"), Quota()) if in_cgroup else None
    try:
        return _bare(workload, seed, scale, rounds, root, group)
    finally:
        if group is not None:
            group.remove()


def ask(proc: subprocess.Popen[str], request: dict[str, object]) -> dict[str, object]:
    """One request line, one blocking answer line."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(request) + "\n")
    proc.stdin.flush()
    answer: dict[str, object] = json.loads(proc.stdout.readline())
    return answer


def _bare(
    workload: str, seed: int, scale: float, rounds: int, root: Path, group: quota.Cgroup | None
) -> list[float]:
    """The bare loop itself, optionally joining ``group`` before exec."""
    fixture = ensure_fixture(workload, seed, scale, root / "fixtures")
    workspace = Path(tempfile.mkdtemp(dir=root, prefix="bare-")) / "ws"
    copy_fixture(fixture, workspace)
    argv = [PAYLOAD_PYTHON, "-I", "-S", str(PAYLOAD_PATH), "--workload", workload,
            "--seed", str(seed), "--scale", repr(scale), "--root", str(workspace)]  # fmt: skip
    preexec = group.preexec() if group is not None else None
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=preexec
    )
    if group is not None:
        group.close_preexec()
    assert proc.stdin is not None and proc.stdout is not None
    assert json.loads(proc.stdout.readline())["op"] == "ready"
    times = []
    ask(proc, {"op": "check", "k": 0})  # round 1's inputs, outside the clock (as the runner)
    for k in range(1, rounds + 1):
        start = time.monotonic_ns()
        answer = ask(proc, {"op": "round", "k": k})
        times.append((time.monotonic_ns() - start) / 1e9)
        assert answer["op"] == "done", answer
        assert ask(proc, {"op": "check", "k": k}).get("validated"), k
    proc.stdin.write('{"op": "exit"}\n')
    proc.stdin.close()
    assert proc.wait() == 0
    shutil.rmtree(workspace.parent)
    return times


def runner_record(
    mode: str,
    workload: str,
    scale: float,
    rounds: int,
    root: Path,
    options: dict[str, object] | None = None,
):  # type: ignore[no-untyped-def]
    """One environment through the runner; its record (must pass)."""
    spec = EnvironmentSpec(
        campaign="bench", host="local", mode=mode, workload=workload, env_index=0, scale=scale,
        rounds=rounds, work_root=str(root), mode_options=options or {},
    )  # fmt: skip
    record = run_environment(spec)
    assert record is not None and record.outcome == "passed", record and record.detail
    return record


def overhead(scale: float, envs: int, rounds: int, root: Path) -> None:
    """Print runner vs. bare environment task times per workload in native mode."""
    print(f"native, scale {scale}, {envs} environments x {rounds} rounds each way")
    print(f"{'workload':<18} {'runner s':>9} {'bare-cg s':>9} {'bare s':>9}"
          f" {'runner/bare-cg':>15} {'bare-cg/bare':>13}")  # fmt: skip
    harness, grouping = [], []
    for name in WORKLOADS:
        runner, bare_cg, bare = [], [], []
        for _ in range(envs):
            record = runner_record("native", name, scale, rounds, root)
            runner.append(sum(r.task_s for r in record.rounds))
            bare_cg.append(sum(bare_rounds(name, 0, scale, rounds, root, in_cgroup=True)))
            bare.append(sum(bare_rounds(name, 0, scale, rounds, root, in_cgroup=False)))
        r, c, b = (statistics.median(x) for x in (runner, bare_cg, bare))
        harness.append(r / c)
        grouping.append(c / b)
        print(f"{name:<18} {r:>9.4f} {c:>9.4f} {b:>9.4f} {r / c:>15.3f} {c / b:>13.3f}")
    print(f"{'median of the ratios':<48} {statistics.median(harness):>15.3f}"
          f" {statistics.median(grouping):>13.3f}")  # fmt: skip


def ready(envs: int, root: Path) -> None:
    """Print Ready (ms) per mode: min / median / max."""
    print(f"\nReady per mode ({READY_WORKLOAD}, {envs} environments), ms")
    print(f"{'mode':<10} {'min':>8} {'median':>8} {'max':>8}")
    for mode, options in READY_MODES.items():
        values = [runner_record(mode, READY_WORKLOAD, 0.02, 1, root, options).ready_ms or 0.0
                  for _ in range(envs)]  # fmt: skip
        print(f"{mode:<10} {min(values):>8.1f} {statistics.median(values):>8.1f}"
              f" {max(values):>8.1f}")  # fmt: skip


def main() -> None:
    """Parse options, run both measurements in a private work root."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--envs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ready-envs", type=int, default=7)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sandbench-overhead-", dir="/var/tmp"))
    print("load average at start: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
    try:
        overhead(args.scale, args.envs, args.rounds, root)
        ready(args.ready_envs, root)
    finally:
        shutil.rmtree(root)
    print("load average at end: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
