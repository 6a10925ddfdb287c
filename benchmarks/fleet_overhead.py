"""Benchmark: per-environment orchestration overhead of the fleet, step by step.

Real redis-server (ops/redis.conf's fsync policy), one real worker process and the coordinator,
both started through ``benchmarks/traced.py`` so each orchestration step's calls are timed in
place. Environments (native ``publish`` at scale 0.02, one round) are sent one at a time, each
after the previous record was stored, so no queueing is counted. Per environment:

    overhead = (message sent -> record durably appended by the coordinator) - the runner's own
    ``run_environment``

Everything else is the fleet's: delivery to the worker's task, spec verification, claim,
heartbeat, flag check, signing, the record's send and delivery, the coordinator's verify, the
append, its chain link and fsync, and the acknowledgement with the stored mark. Prints median
and p95 of the overhead beside the targets and a breakdown per step (each step's time per
environment; "delivery" is message sent -> the worker's task code starts, "record delivery"
the send of the record -> the coordinator's intake takes it).

Run: .venv/bin/python benchmarks/fleet_overhead.py [N]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.traced import TRACE_ENV  # noqa: E402
from contract.app import create_app  # noqa: E402
from contract.outbox import Outbox  # noqa: E402
from contract.records import EnvironmentSpec  # noqa: E402
from coordinator.fleet.coordinator import STORED_AT_KEY  # noqa: E402
from coordinator.fleet.dispatch import send_specs, watch_campaign, with_task_ids  # noqa: E402
from coordinator.store.store import Store  # noqa: E402
from tests.fleet_helpers import PYTHON, Fleet, Proc, wait_until  # noqa: E402

DEFAULT_N = 60
WARMUP = 3  # first environments of a fresh worker (imports, first preflight): not counted
CAMPAIGN = "c-bench-overhead"
TRACED = str(REPO / "benchmarks" / "traced.py")
TARGET_MEDIAN_MS, TARGET_P95_MS = 15.0, 30.0
HIDDEN = {"task", "intake batch", "runner"}  # spans that contain other steps
# After the record's hand-over (worker) or its append (coordinator): off the overhead's path.
AFTER = {"provenance check", "finalize check"}


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def start(fleet: Fleet, args: list[str], home: Path, log: str, trace: Path) -> Proc:
    """Start ``sandbench ARGS`` traced, as the fleet helpers start it; wait for its ready line."""
    env = {**fleet.env(home, fleet.redis.url()), TRACE_ENV: str(trace)}
    proc = fleet.spawn([PYTHON, TRACED, *args], env, log)
    wait_until(lambda: " ready." in proc.own_text() or not proc.alive(), 60, f"{log} ready")
    assert proc.alive(), proc.text()
    return proc


def run(n: int, root: Path) -> tuple[list[dict[str, float]], list[dict[str, Any]]]:
    """Run ``n`` environments one by one; each one's fleet timings and every traced span."""
    fleet = Fleet(root, ["lab-a"])
    fleet.redis.start()
    app = create_app(fleet.redis.url())
    client = fleet.redis.client()
    trace = root / "trace.jsonl"
    try:
        fleet.register_hosts()
        host = fleet.hosts["lab-a"]
        start(fleet, ["worker", "--host", "lab-a", "--work-root", str(host.work_root)],
              host.home, "worker-lab-a", trace)  # fmt: skip
        start(fleet, ["coordinator", "--data", str(fleet.data)], fleet.coordinator_home,
              "coordinator", trace)  # fmt: skip
        specs = with_task_ids([
            EnvironmentSpec(campaign=CAMPAIGN, host="lab-a", mode="native", workload="publish",
                            env_index=i, order_index=i, scale=0.02, rounds=1, limit_s=30,
                            work_root=str(host.work_root))
            for i in range(n + WARMUP)
        ])  # fmt: skip
        store = Store(fleet.data, signer=fleet.coordinator_key)
        store.create_campaign("", {}, specs)
        watch_campaign(app, CAMPAIGN)
        key = STORED_AT_KEY.format(campaign=CAMPAIGN)
        with Outbox(app) as outbox:  # one outbox, as a dispatch (or a refill) keeps one
            for spec in specs:
                send_specs(app, [spec], store.signer, outbox)
                wait_until(
                    lambda s=spec: client.hexists(key, s.key()), 60, f"{spec.key()} stored", 0.002
                )
        time.sleep(0.5)  # the last steps after the last store (finalize check) reach the trace
        stored = client.hgetall(key)
        timings = []
        for record in store.records(CAMPAIGN, "lab-a"):
            if record.env_index >= WARMUP:
                stored_at = float(stored[record.key()])
                ready = record.ready_ms
                timings.append({**record.fleet, "stored_at": stored_at, "ready_ms": ready})
        spans = [json.loads(line) for line in trace.read_text().splitlines()]
        return timings, spans
    finally:
        client.close()
        app.close()
        fleet.close()


def breakdown(
    timings: list[dict[str, float]], spans: list[dict[str, Any]]
) -> dict[str, list[float]]:
    """Each step's milliseconds per environment (spans inside its send -> store window)."""
    per_step: dict[str, list[float]] = defaultdict(list)
    for t in timings:
        mine = [s for s in spans if t["sent_at"] <= s["t0"] <= t["stored_at"]]
        total: dict[str, float] = defaultdict(float)
        first: dict[str, float] = {}
        for s in mine:
            total[s["step"]] += (s["t1"] - s["t0"]) * 1e3
            first.setdefault(s["step"], s["t0"])
        total["append"] -= total["chain link"]  # the link is listed on its own
        total["delivery"] = (first["task"] - t["sent_at"]) * 1e3
        if "intake batch" in first:
            total["record delivery"] = (first["intake batch"] - first["send"]) * 1e3
        window = (t["stored_at"] - t["sent_at"]) * 1e3
        total["overhead"] = window - total["runner"]
        for step, ms in total.items():
            per_step[step].append(ms)
    return per_step


def main() -> None:
    """Print the overhead's median and p95 beside the targets, then each step's share."""
    n = int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_N
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        began = time.monotonic()
        timings, spans = run(n, Path(tmp))
        took = time.monotonic() - began
    steps = breakdown(timings, spans)
    overhead = steps.pop("overhead")
    median, tail = statistics.median(overhead), p95(overhead)
    print(f"{len(overhead)} environments (native publish, scale 0.02, 1 round) in {took:.1f} s, "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    verdict = "met" if median <= TARGET_MEDIAN_MS and tail <= TARGET_P95_MS else "MISSED"
    print(f"orchestration overhead: median {median:.1f} ms (target <= {TARGET_MEDIAN_MS:.0f}), "
          f"p95 {tail:.1f} ms (target <= {TARGET_P95_MS:.0f}): {verdict}")  # fmt: skip
    listed = 0.0
    print(f"{'step (per environment)':28s} {'median':>8s} {'p95':>8s}")
    ordered = sorted(steps.items(), key=lambda kv: -statistics.median(kv[1]))
    for step, values in ordered:
        if step not in HIDDEN | AFTER:
            listed += statistics.median(values)
            print(f"{step:28s} {statistics.median(values):6.2f} ms {p95(values):6.2f} ms")
    print(f"{'the steps add up to':28s} {listed:6.2f} ms of the median's {median:.2f} (the rest: "
          "Celery and Redis between them; medians only roughly add)")  # fmt: skip
    for step, values in ordered:
        if step in AFTER:
            print(f"{step + ' (after, not in it)':28s} {statistics.median(values):6.2f} ms "
                  f"{p95(values):6.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
