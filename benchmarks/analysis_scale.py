"""How long `sandbench report` takes for 1,000 / 10,000 / 100,000 synthetic environments.

Synthetic campaign: 2 hosts x 10 modes x 19 workloads, N environments per cell chosen to reach
the target count, 3 rounds each; about 2% of cells fail once (rule not-runs follow) and one mode
is unavailable on the second host. Records have the shape and size of real ones (round digests,
per-environment provenance, oracle, a signature-shaped field: the report never verifies, so
the bytes are random). Prints, per size, the median of ``--repeat`` runs of: records load,
analysis and the whole report in process, then the command `sandbench report ID` in a new
process (wall and CPU seconds; imports and the printed tables included), whose wall time is
held against the targets of issue 16 (<= 2 s at 1,000 environments, <= 8 s at 100,000). The
machine is shared: the load average is printed, and CPU seconds do not depend on it.

    .venv/bin/python benchmarks/analysis_scale.py [--sizes 1000,10000,100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from contract.records import (
    NOT_RUN_RULE,
    EnvironmentRecord,
    EnvironmentSpec,
    OracleResult,
    RoundRecord,
    Signature,
    failed_fields,
)
from contract.signing import CoordinatorKey
from coordinator.results.analysis import analyze
from coordinator.results.report import write_report
from coordinator.store.store import Store
from coordinator.store.views import record_views
from worker.modes import BUILTIN_MODES
from workloads.registry import WORKLOADS

HOSTS = ("lab-a", "lab-b")
MODES = (*BUILTIN_MODES, "gvisor")
FAIL_SHARE = 0.02
CID = "c-20261129-bench"
TARGET_S = {1000: 2.0, 100000: 8.0}  # issue 16: whole report, by planned size
PROVENANCE = {
    "cgroup_version": 1, "limit_s": 90.0, "payload_python": "/usr/bin/python3",
    "preflight": {"kernel": "6.18.44", "ok": True, "python": "Python 3.11.2", "reason": "",
                  "overlay": "redirect_dir=off,metacopy=off,index=off"},
    "quota": {"cpu_quota": 2.0, "cpus": "0,1", "memory_bytes": 2147483648, "swap_bytes": 0},
}  # fmt: skip


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
                task_id=f"{rng.getrandbits(128):032x}",
            )  # fmt: skip
            specs.append(spec)
            records.append(_record(spec, rng, base, fail_at, host == "lab-b" and mode == "gvisor"))
    return specs, records


def _record(spec: EnvironmentSpec, rng: random.Random, base: float, fail_at: int | None,
            absent: bool) -> EnvironmentRecord:  # fmt: skip
    signature = Signature(key_id=f"{spec.host}:2c29f3d231a59ce2",
                          ed25519=base64.b64encode(rng.randbytes(64)).decode())  # fmt: skip
    if absent:
        return EnvironmentRecord.from_spec(
            spec, outcome="not-run", reason="preflight: no runsc", signature=signature
        )
    if fail_at is not None and spec.env_index > fail_at:
        return EnvironmentRecord.from_spec(
            spec, outcome="not-run", reason=NOT_RUN_RULE, signature=signature
        )
    digests = [hashlib.sha256(rng.randbytes(8)).hexdigest() for _ in range(3)]
    rounds = [
        RoundRecord(k=k, task_s=base * rng.uniform(0.9, 1.2), validated=True, digest=d)
        for k, d in enumerate(digests, 1)
    ]
    fields = (
        failed_fields("oracle-mismatch", "out/x")
        if spec.env_index == fail_at
        else {"outcome": "passed"}
    )
    return EnvironmentRecord.from_spec(
        spec, rounds=rounds, ready_ms=rng.uniform(5, 900), exit_code=0, cpu_s=rng.uniform(0.1, 2),
        peak_memory_bytes=rng.randrange(1 << 20, 1 << 30), oracle=OracleResult(ok=True),
        original_intact=True, started_at="2026-11-29T19:40:02Z", provenance=PROVENANCE,
        signature=signature, **fields,
    )  # fmt: skip


Row = tuple[float, float, float, float, float]  # load, analysis, report, CLI wall, CLI CPU


def measure(total: int, repeat: int) -> tuple[int, Row]:
    """Environments and the medians of ``repeat`` runs of each figure."""
    specs, records = synthetic(total)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp), signer=CoordinatorKey.generate())
        store.create_campaign(
            "# synthetic\n", {"name": "bench", "seed": 1, "environments": 0}, specs
        )
        for host in HOSTS:
            store.append_records([r for r in records if r.host == host])
        runs = [(*_in_process(store), *_command(Path(tmp))) for _ in range(repeat)]
    medians = tuple(statistics.median(r[i] for r in runs) for i in range(5))
    return len(specs), medians  # type: ignore[return-value]


def _in_process(store: Store) -> tuple[float, float, float]:
    """Record load, analysis, and the whole ``write_report`` (which loads and analyzes again)."""
    t0 = time.perf_counter()
    loaded = record_views(line for _, _, line in store.record_lines(CID))
    t1 = time.perf_counter()
    analyze(loaded, store.campaign_view(CID))
    t2 = time.perf_counter()
    write_report(store, CID)
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def _command(data: Path) -> tuple[float, float]:
    """Wall and CPU seconds of the command itself: ``sandbench report ID`` in a new process."""
    argv = [sys.executable, "-m", "coordinator", "report", CID, "--data", str(data)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    """Print one line per size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print("in-process: load, analysis and write_report (csv, plots, md, html) timed apart;")
    print("command: `sandbench report ID` in a new process, imports and printed tables included")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'environments':>12} {'N/cell':>6} {'load s':>7} {'analysis s':>10} {'report s':>8} "
          f"{'command s':>9} {'cpu s':>6} {'target s':>8}  verdict")  # fmt: skip
    for size in sizes:
        count, (load, analysis, report, wall, cpu) = measure(size, args.repeat)
        per_cell = count // (len(HOSTS) * len(MODES) * len(WORKLOADS))
        target = TARGET_S.get(size)
        verdict = "-" if target is None else ("meets" if wall <= target else "MISSES")
        print(f"{count:>12,} {per_cell:>6} {load:>7.2f} {analysis:>10.2f} {report:>8.2f} "
              f"{wall:>9.2f} {cpu:>6.2f} {target or '-':>8}  {verdict}",
              flush=True)  # fmt: skip
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
