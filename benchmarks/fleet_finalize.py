"""Benchmark: the store-driven finalizer on one host with about 100,000 signed records.

Builds a campaign of 19 workloads x 6 modes x 438 environments (49,932, near the plan's cap
per host) plus the sentinel's points, all on one host, and a second attempt of every cell (as
``sandbench rerun`` of each cell adds): about 101,000 planned environments. One host-signed record
per planned environment is appended through the store (so each line is chained and linked by
the coordinator key, as in the fleet); a few cells of the first attempt fail early so the
first-failure rule has work. Then a fresh process times
``Coordinator.finalize`` (planned versus received set from the store, the head sealed, the rule
re-applied, per-host statistics, results.csv and the report) and reports its memory peak
(VmHWM, the peak resident set, less the size after imports): bounded means well below what holding
every record in memory costs.
Finally ``verify`` checks the campaign as finalized.

Run: .venv/bin/python benchmarks/fleet_finalize.py
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.records import EnvironmentRecord, RoundRecord, failed_fields  # noqa: E402
from contract.signing import COORDINATOR_KEY_FILE, HostKey, sign_record  # noqa: E402
from coordinator.fleet.dispatch import with_task_ids  # noqa: E402
from coordinator.plan.campaign import expand  # noqa: E402
from coordinator.plan.file import parse_plan  # noqa: E402
from coordinator.store.store import Store  # noqa: E402
from coordinator.store.trust import REGISTRY_FILE, HostRegistry, own_coordinator_key  # noqa: E402

PLAN = """
name = "finalizer-benchmark"
seed = 3
environments = 438
rounds = 3
workloads = ["all"]
modes = ["native", "host", "staged", "docker", "podman", "vm"]
"""
HOST = "lab-a"
CAMPAIGN = "c-bench-finalize"
TARGET_S = 10.0
BATCH = 2000  # records per append (one lock, one fsync)
FAILING = 3  # cells whose 5th environment fails (the rule leaves the rest not run)


def outcome(spec: Any, fails_at: dict[tuple[str, str], int], rng: random.Random) -> dict[str, Any]:
    """The record fields of ``spec``: passed, or failed / not run in a failing cell."""
    at = fails_at.get((spec.mode, spec.workload))
    if at is not None and spec.kind == "environment" and spec.attempt == 1:
        if spec.order_index == at:
            return failed_fields("nonzero-exit", "exit status 1")
        if spec.order_index > at:
            return {"outcome": "not-run", "reason": "first-failure-rule"}
    rounds = [RoundRecord(k=k, task_s=rng.uniform(0.05, 0.5), validated=True) for k in (1, 2, 3)]
    return {"outcome": "passed", "ready_ms": rng.uniform(10, 60), "rounds": rounds, "exit_code": 0}


def build(root: Path) -> tuple[Store, int]:
    """The campaign and one signed, chained record per planned environment; how many."""
    store = Store(root / "data", signer=own_coordinator_key(root / COORDINATOR_KEY_FILE))
    plan = parse_plan(PLAN)
    first = with_task_ids(expand(plan, [HOST], CAMPAIGN, str(root / "w")))
    store.create_campaign(PLAN, plan, first)
    again = [s.model_copy(update={"attempt": 2}) for s in first if s.kind == "environment"]
    store.add_environments(CAMPAIGN, with_task_ids(again))
    key = HostKey.generate(HOST)
    HostRegistry(root / REGISTRY_FILE).add(HOST, key.public_b64())
    specs = store.load_campaign(CAMPAIGN).host_specs(HOST)
    rng = random.Random(1)
    cells = sorted({(s.mode, s.workload) for s in specs})
    fails_at = {}  # the cell's 5th environment in run order fails
    for cell in rng.sample(cells, FAILING):
        order = sorted(
            s.order_index for s in specs if (s.mode, s.workload, s.attempt) == (*cell, 1)
        )
        fails_at[cell] = order[4]
    for i in range(0, len(specs), BATCH):
        records = [
            sign_record(EnvironmentRecord.from_spec(s, **outcome(s, fails_at, rng)), key)
            for s in specs[i : i + BATCH]
        ]
        store.append_records(records)
    return store, len(specs)


def peak_rss_kib() -> int:
    """This process's peak resident set (VmHWM: unlike ru_maxrss, not inherited over exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/self/status")


def finalize_child(root: str) -> None:
    """In a fresh process: finalize the host; print seconds and memory as JSON."""
    import redis

    import coordinator.results.report  # imported before the base is taken (pandas)
    from contract.app import create_app
    from coordinator.fleet.coordinator import Coordinator

    base_kib = peak_rss_kib()
    store = Store(Path(root) / "data")
    app = create_app(os.environ["BENCH_BROKER"])
    client = redis.Redis.from_url(os.environ["BENCH_BROKER"], decode_responses=True)
    coordinator = Coordinator(store, HostRegistry(Path(root) / REGISTRY_FILE), client, app)
    t0 = time.perf_counter()
    result = coordinator.finalize(CAMPAIGN, HOST)
    took = time.perf_counter() - t0
    peak_kib = peak_rss_kib()
    print(json.dumps({"s": took, "finalized": result["finalized"],
                      "violations": result.get("violations", []),
                      "rss_mib": (peak_kib - base_kib) / 1024}))  # fmt: skip


def run_child(root: Path, broker: str) -> dict[str, Any]:
    """``finalize_child`` in a fresh interpreter; its JSON line."""
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from benchmarks.fleet_finalize "
            f"import finalize_child; finalize_child({str(root)!r})")  # fmt: skip
    env = {**os.environ, "BENCH_BROKER": broker, "SANDBENCH_HOME": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=False, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    """Print the finalizer's time and memory beside the target, and verify's verdict.

    ``--keep DIR`` builds the store into DIR once and reuses it on later runs.
    """
    from tests.fleet_helpers import OPS_APPENDFSYNC, RedisServer

    keep = Path(sys.argv[2]) if sys.argv[1:2] == ["--keep"] else None
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        root = keep or Path(tmp)
        server = RedisServer(Path(tmp) / "redis", appendfsync=OPS_APPENDFSYNC)
        server.start()
        try:
            t0 = time.perf_counter()
            if keep is not None and (root / "data").is_dir():
                store = Store(root / "data")
                n = len(store.load_campaign(CAMPAIGN).specs)
            else:
                store, n = build(root)
            built = time.perf_counter() - t0
            size_mib = store.records_path(CAMPAIGN, HOST).stat().st_size / 2**20
            timed = run_child(root, server.url())
            verdict = verify(root)
        finally:
            server.stop()
    assert timed["finalized"], timed
    ok = timed["s"] <= TARGET_S
    print(f"{n} records of one host (signed, chained, 3 rounds each; {size_mib:.0f} MiB) built "
          f"in {built:.0f} s; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"finalize_host (seal, rule, statistics, results.csv, report): {timed['s']:.2f} s "
          f"(target <= {TARGET_S:.0f} s: {'met' if ok else 'MISSED'})")  # fmt: skip
    print(f"memory peak: {timed['rss_mib']:.0f} MiB resident above the process after imports "
          f"(VmHWM); the records file is {size_mib:.0f} MiB")  # fmt: skip
    print(f"rule violations found: {len(timed['violations'])}; verify: {verdict}")


def verify(root: Path) -> str:
    """``sandbench verify`` of the finalized campaign: its verdict line."""
    env = {**os.environ, "SANDBENCH_HOME": str(root)}
    argv = [sys.executable, "-m", "coordinator", "verify", CAMPAIGN, "--data", str(root / "data")]
    out = subprocess.run(argv, env=env, cwd=REPO, check=False, capture_output=True, text=True)
    lines = (out.stdout + out.stderr).strip().splitlines()
    return lines[-1] if lines else f"exit {out.returncode}"


if __name__ == "__main__":
    main()
