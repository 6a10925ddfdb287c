"""How long analysis and the report take for 1,000 / 10,000 / 100,000 synthetic environments.

Synthetic campaign: 2 hosts x 9 modes x 19 workloads, N environments per cell chosen to reach
the target count, 3 rounds each; about 2% of cells fail once (rule not-runs follow) and one mode
is unavailable on the second host. Prints, per size: records load, analysis, and the whole
report (load + analysis + results.csv + plots + report.md/.html). Aim: under 10 s at 100,000.

    .venv/bin/python benchmarks/analysis_scale.py [--sizes 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from coordinator.analysis import analyze
from coordinator.report import write_report
from coordinator.store import Store
from tasks.records import (
    NOT_RUN_RULE,
    EnvironmentRecord,
    EnvironmentSpec,
    RoundRecord,
    failed_fields,
)
from worker.modes import BUILTIN_MODES
from workloads.registry import WORKLOADS

HOSTS = ("lab-a", "lab-b")
MODES = (*BUILTIN_MODES, "gvisor")
FAIL_SHARE = 0.02
CID = "c-20261129-bench"


def synthetic(total: int, seed: int = 1) -> tuple[list[EnvironmentSpec], list[EnvironmentRecord]]:
    """Planned environments and their records, about ``total`` of them."""
    rng = random.Random(seed)
    cells = [(h, m, w) for h in HOSTS for m in MODES for w in WORKLOADS]
    n = max(1, round(total / len(cells)))
    specs, records = [], []
    for host, mode, workload in cells:
        fail_at = rng.randrange(n) if rng.random() < FAIL_SHARE else None
        base = rng.uniform(0.05, 5.0)
        for i in range(n):
            spec = EnvironmentSpec(
                campaign=CID, host=host, mode=mode, workload=workload, env_index=i,
                order_index=len(specs), seed=seed, work_root="/w",
            )  # fmt: skip
            specs.append(spec)
            records.append(_record(spec, rng, base, fail_at, host == "lab-b" and mode == "gvisor"))
    return specs, records


def _record(spec: EnvironmentSpec, rng: random.Random, base: float, fail_at: int | None,
            absent: bool) -> EnvironmentRecord:  # fmt: skip
    if absent:
        return EnvironmentRecord.from_spec(spec, outcome="not-run", reason="preflight: no runsc")
    if fail_at is not None and spec.env_index > fail_at:
        return EnvironmentRecord.from_spec(spec, outcome="not-run", reason=NOT_RUN_RULE)
    rounds = [
        RoundRecord(k=k, task_s=base * rng.uniform(0.9, 1.2), validated=True) for k in (1, 2, 3)
    ]
    fields = (
        failed_fields("oracle-mismatch", "out/x")
        if spec.env_index == fail_at
        else {"outcome": "passed"}
    )
    return EnvironmentRecord.from_spec(spec, rounds=rounds, ready_ms=rng.uniform(5, 900), **fields)


def measure(total: int) -> tuple[int, float, float, float]:
    """(environments, load s, analysis s, whole report s) for a synthetic campaign of ``total``."""
    specs, records = synthetic(total)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp))
        store.create_campaign(
            "# synthetic\n", {"name": "bench", "seed": 1, "environments": 0}, specs
        )
        for host in HOSTS:
            store.append_records([r for r in records if r.host == host])
        t0 = time.perf_counter()
        loaded = store.record_dicts(CID)
        t1 = time.perf_counter()
        analyze(loaded, store.load_campaign(CID))
        t2 = time.perf_counter()
        write_report(store, CID)
        t3 = time.perf_counter()
    return len(specs), t1 - t0, t2 - t1, t3 - t2


def main() -> None:
    """Print one line per size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    sizes = [int(s) for s in parser.parse_args().sizes.split(",")]
    print("report s = all of `sandbench report`: load, analysis, results.csv, plots, md, html")
    print(f"{'environments':>12} {'N/cell':>6} {'load s':>8} {'analysis s':>10} {'report s':>9}")
    for size in sizes:
        count, load, analysis, report = measure(size)
        per_cell = count // (len(HOSTS) * len(MODES) * len(WORKLOADS))
        print(
            f"{count:>12,} {per_cell:>6} {load:>8.2f} {analysis:>10.2f} {report:>9.2f}", flush=True
        )


if __name__ == "__main__":
    main()
