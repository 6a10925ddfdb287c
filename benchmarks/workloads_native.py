"""Per workload, natively on this machine: fixture build time and the three round times.

Usage: ``.venv/bin/python benchmarks/workloads_native.py [--scale 1.0] [--seed 1] [names...]``.
Each workload gets a fresh fixture cache (so its build is measured, not reused), a fresh
workspace, three rounds through the payload as a subprocess, then the oracle. A failed
environment is printed as such, never as a time, and makes the script exit 1.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads.drive import native_environment
from workloads.registry import resolve

ROUNDS = 3
WORK_DIR = Path("/var/tmp")  # a real disk, like the runner's work root


def bench(name: str, seed: int, scale: float) -> tuple[str, bool]:
    """One table row (build seconds, round seconds, validation and oracle verdicts); passed?"""
    scratch = Path(tempfile.mkdtemp(prefix="sandbench-bench-", dir=WORK_DIR))
    try:
        run = native_environment(name, seed, scale, ROUNDS, scratch / "cache", scratch / "ws")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    done = [m for m in run.drive.lines if m.get("op") == "done"]
    if len(done) != ROUNDS or run.drive.exit_code != 0:
        return f"{name:<18} {run.build_s:>8.2f}  FAILED: {run.drive.lines[-1]}", False
    rounds = "  ".join(f"{s:>7.3f}" for s in run.drive.round_s)
    valid = "yes" if run.drive.ok else "NO"  # every round's check (after its clock) passed
    oracle = "match" if not run.mismatches else f"{len(run.mismatches)} mismatches"
    total = sum(run.drive.round_s)
    row = f"{name:<18} {run.build_s:>8.2f}  {rounds}  {total:>7.3f}  {valid:<9} {oracle}"
    return row, run.drive.ok and not run.mismatches


def main() -> int:
    """Print the table for the chosen workloads; 1 if any environment failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("names", nargs="*", default=["all"])
    args = parser.parse_args()
    print(f"native, scale {args.scale}, seed {args.seed}, {ROUNDS} rounds, times in seconds")
    print(f"{'workload':<18} {'build_s':>8}  {'round1':>7}  {'round2':>7}  {'round3':>7}"
          f"  {'sum':>7}  validated oracle")  # fmt: skip
    failed = []
    for name in resolve(args.names):
        row, passed = bench(name, args.seed, args.scale)
        print(row, flush=True)
        failed += [] if passed else [name]
    if failed:
        print(f"FAILED environments: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
