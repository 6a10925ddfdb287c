"""Ready (N environments) per VM mode, and publish round times for native, vm and vm-writeback.

Every figure comes from real environments through the runner (marker, cgroup, limit, oracle).
Environments are interleaved mode by mode (native, vm, vm-writeback, vm-disk, vm-microvm, native,
...) so all modes see the same machine state; each runs ``publish`` for R rounds. Ready runs from
the marker through QEMU start, guest kernel boot, the init's module loads and 9p mounts, to the
guest payload's ready line. The accelerator (KVM if its probe boot got Ready, else TCG) is
printed with the figures.

    .venv/bin/python benchmarks/vm_ready.py [--envs 10] [--scale 1.0] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.records import EnvironmentRecord, EnvironmentSpec  # noqa: E402
from worker.runner import run_environment  # noqa: E402
from worker.vm import accel, guest, qemu  # noqa: E402

VM_MODES = ("vm", "vm-writeback", "vm-disk", "vm-microvm")
ROUND_MODES = ("native", "vm", "vm-writeback")
WORKLOAD = "publish"
LIMIT_S = 300.0


def run_one(mode: str, index: int, args: argparse.Namespace, work_root: Path) -> EnvironmentRecord:
    """One environment of ``mode`` (a failure is a record, printed and kept)."""
    spec = EnvironmentSpec(
        campaign="c-bench-vm", host="local", mode=mode, workload=WORKLOAD, env_index=index,
        scale=args.scale, rounds=args.rounds, limit_s=LIMIT_S, work_root=str(work_root),
    )  # fmt: skip
    record = run_environment(spec)
    assert record is not None
    status = "ok" if record.outcome == "passed" else f"FAILED {record.reason}: {record.detail}"
    ready = f"{record.ready_ms:.0f} ms" if record.ready_ms is not None else "-"
    rounds = " ".join(f"{r.task_s:.3f}" for r in record.rounds)
    print(f"  {mode:<12} #{index}: Ready {ready:>9}  rounds [{rounds}] s  {status}", flush=True)
    return record


def summary(records: list[EnvironmentRecord]) -> dict[str, object]:
    """Ready min/median/max (ms) and publish round medians (s) of passed environments."""
    passed = [r for r in records if r.outcome == "passed"]
    ready = [r.ready_ms for r in passed if r.ready_ms is not None]
    rounds = [x.task_s for r in passed for x in r.rounds]
    sums = [sum(x.task_s for x in r.rounds) for r in passed]
    return {
        "passed": len(passed),
        "ran": len(records),
        "ready_ms": _three(ready),
        "round_s_median": round(statistics.median(rounds), 4) if rounds else None,
        "env_sum_s_median": round(statistics.median(sums), 4) if sums else None,
    }


def _three(values: list[float]) -> list[float] | None:
    """min, median, max rounded, or None when empty."""
    if not values:
        return None
    return [round(min(values), 1), round(statistics.median(values), 1), round(max(values), 1)]


def print_table(results: dict[str, dict[str, object]], accel_name: str) -> None:
    """The figures, one line per mode."""
    print(f"\naccelerator: {accel_name}   QEMU {qemu.qemu_version()}   workload: {WORKLOAD}")
    print(
        f"{'mode':<13}{'passed':>8}  {'Ready ms min/median/max':<28}{'round s':>9}{'env sum s':>11}"
    )
    for mode, s in results.items():
        spread = s["ready_ms"]
        ready = "/".join(f"{v:.0f}" for v in spread) if isinstance(spread, list) else "-"
        rnd = s["round_s_median"] if mode in ROUND_MODES else "(n/a)"
        counts = f"{s['passed']}/{s['ran']}"
        print(f"{mode:<13}{counts:>8}  {ready:<28}{rnd!s:>9}{s['env_sum_s_median']!s:>11}")


def main() -> None:
    """Run the interleaved environments and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=10)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="also print the summary as JSON")
    args = parser.parse_args()
    prepared = guest.load_guest()
    problem = guest.guest_problem(prepared)
    if problem or prepared is None:
        sys.exit(f"vm_ready: {problem}")
    accel_name = str(accel.detect_accel(prepared).get("accel"))
    modes = ("native", *VM_MODES)
    records: dict[str, list[EnvironmentRecord]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-vm-", dir="/var/tmp") as tmp:
        for index in range(args.envs):
            for mode in modes:
                records[mode].append(run_one(mode, index, args, Path(tmp)))
    results = {mode: summary(recs) for mode, recs in records.items()}
    print_table(results, accel_name)
    if args.json:
        print(json.dumps({"accel": accel_name, "qemu": qemu.qemu_version(), "modes": results}))


if __name__ == "__main__":
    main()
