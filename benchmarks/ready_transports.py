"""Ready minus spawn through each real transport: ``env run``, the embedded ``run``, a fleet worker.

The runner takes the marker right before the launcher's exec (``worker.procs.spawn_marked``); a
harness process that has pandas and Celery imported must not pay for its size there. Per
transport, ``--n`` native environments of ``publish`` at scale 0.02 (one round) and, around
them, ``--n`` bare spawns of ``python3 -I -S -c`` printing a line, spawned and read as the
runner spawns (benchmarks/fidelity.py's ``spawn_ms``, from this small process). Figure: median
Ready - median spawn. Target: <= 3 ms in every transport.

    .venv/bin/python benchmarks/ready_transports.py [--n 15] [--transports env-run run fleet]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.fidelity import load, machine, spawn_ms  # noqa: E402  (after the sys.path line)

TARGET_MS = 3.0
SANDBENCH = [sys.executable, "-m", "coordinator"]
PLAN = """name = "ready"
seed = 1
environments = {n}
rounds = 1
scale = 0.02
sentinel = false
workloads = ["publish"]
modes = ["native"]
"""


def env_run(n: int, root: Path) -> list[float]:
    """Ready of ``n`` environments, each its own ``sandbench env run`` process."""
    ready = []
    for _ in range(n):
        argv = [*SANDBENCH, "env", "run", "--mode", "native", "--workload", "publish", "--scale",
                "0.02", "--rounds", "1", "--work-root", str(root), "--json"]  # fmt: skip
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, cwd=REPO, check=True
        )
        ready.append(float(json.loads(out.stdout)["ready_ms"]))
    return ready


def embedded_run(n: int, root: Path) -> list[float]:
    """Ready of the ``n`` environments of one embedded ``sandbench run``."""
    plan = root / "ready.toml"
    plan.write_text(PLAN.format(n=n))
    data = root / "data"
    env = {**os.environ, "SANDBENCH_HOME": str(root / "home")}
    subprocess.run([*SANDBENCH, "run", str(plan), "--data", str(data), "--work-root",
                    str(root / "work")], capture_output=True, text=True, timeout=600, cwd=REPO,
                   env=env, check=True)  # fmt: skip
    lines = [json.loads(line) for log in data.rglob("records.jsonl") for line in log.open()]
    return [float(r["ready_ms"]) for r in lines if r.get("kind") == "environment"]


def fleet(n: int, root: Path) -> list[float]:
    """Ready of ``n`` environments run by a real fleet worker (benchmarks/fleet_overhead.py)."""
    from benchmarks.fleet_overhead import run

    timings, _ = run(n, root)
    return [float(t["ready_ms"]) for t in timings]


TRANSPORTS: dict[str, Callable[[int, Path], list[float]]] = {
    "env-run": env_run, "run": embedded_run, "fleet": fleet,
}  # fmt: skip


def measure(name: str, n: int) -> tuple[float, float]:
    """Median Ready through transport ``name`` and median bare spawn around it."""
    spawns = [spawn_ms() for _ in range(n)]
    with tempfile.TemporaryDirectory(prefix=f"sb-ready-{name}-") as tmp:
        ready = TRANSPORTS[name](n, Path(tmp))
    spawns += [spawn_ms() for _ in range(n)]
    return statistics.median(ready), statistics.median(spawns)


def main() -> int:
    """Print each transport's Ready, spawn and difference beside the target; 1 if one misses."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=15)
    parser.add_argument(
        "--transports", nargs="+", choices=list(TRANSPORTS), default=list(TRANSPORTS)
    )
    args = parser.parse_args()
    print(f"{machine()}; load {load()}")
    print(f"{'transport':<10} {'Ready ms':>9} {'spawn ms':>9} {'Ready-spawn':>12}  target")
    missed = 0
    for name in args.transports:
        ready, spawn = measure(name, args.n)
        verdict = "met" if ready - spawn <= TARGET_MS else "MISSED"
        missed += verdict == "MISSED"
        print(f"{name:<10} {ready:>9.2f} {spawn:>9.2f} {ready - spawn:>12.2f}  "
              f"<= {TARGET_MS} {verdict}")  # fmt: skip
    print(f"load {load()}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
