"""Ready and publish round times, native beside docker, from one run on this host.

Environments alternate native, docker, native, ... so both modes see the same machine state.
Ready in docker mode runs from the marker through ``docker start -ai`` (attach, container start)
to the payload's ready line; the container was created beforehand (preparation, not timed).

    .venv/bin/python benchmarks/docker_vs_native.py [--envs 5] [--scale 1.0] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.records import EnvironmentRecord, EnvironmentSpec  # noqa: E402
from worker.dockerd import Dockerd  # noqa: E402
from worker.runner import run_environment  # noqa: E402

MODES = ("native", "docker")
WORKLOAD = "publish"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=5, help="environments per mode")
    parser.add_argument("--scale", type=float, default=1.0, help="publish workload scale")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per environment")
    parser.add_argument("--work-root", type=Path, default=None, help="default: a temporary dir")
    return parser.parse_args(argv)


def run_pair(index: int, args: argparse.Namespace, work_root: Path) -> list[EnvironmentRecord]:
    """One native and one docker environment of the publish workload."""
    records = []
    for mode in MODES:
        spec = EnvironmentSpec(
            campaign="bench-docker-vs-native", host="local", mode=mode, workload=WORKLOAD,
            env_index=index, seed=1, scale=args.scale, rounds=args.rounds,
            work_root=str(work_root),
        )  # fmt: skip
        record = run_environment(spec)
        assert record is not None
        records.append(record)
    return records


def row(record: EnvironmentRecord) -> str:
    """One environment as a table row."""
    rounds = " ".join(f"{r.task_s * 1000:7.1f}" for r in record.rounds)
    total = sum(r.task_s for r in record.rounds) * 1000
    ready = f"{record.ready_ms:8.1f}" if record.ready_ms is not None else "       —"
    status = record.outcome if record.reason is None else f"{record.outcome}: {record.reason}"
    return f"{record.mode:<7} {record.env_index:>3} {ready} | {rounds} | {total:8.1f}  {status}"


def summary(records: list[EnvironmentRecord]) -> list[str]:
    """Per mode: Ready min/median/max, median round, median environment sum (passed only)."""
    lines = ["", "mode    n  Ready ms min / median / max   round ms median   env sum ms median"]
    medians: dict[str, tuple[float, float]] = {}
    for mode in MODES:
        ok = [r for r in records if r.mode == mode and r.outcome == "passed"]
        if not ok:
            lines.append(f"{mode:<7} 0  — (no passed environment)")
            continue
        ready = sorted(r.ready_ms or 0.0 for r in ok)
        rounds = [x.task_s * 1000 for r in ok for x in r.rounds]
        sums = [sum(x.task_s for x in r.rounds) * 1000 for r in ok]
        medians[mode] = (statistics.median(ready), statistics.median(sums))
        lines.append(
            f"{mode:<7} {len(ok)}  {ready[0]:8.1f} / {statistics.median(ready):8.1f} / "
            f"{ready[-1]:8.1f}   {statistics.median(rounds):14.1f}   {medians[mode][1]:16.1f}"
        )
    if len(medians) == 2:
        (nr, ns), (dr, ds) = medians["native"], medians["docker"]
        lines.append(f"docker - native: Ready {dr - nr:+.1f} ms, env sum {ds - ns:+.1f} ms "
                     f"(x{ds / ns:.2f})")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the alternating environments and print the side-by-side table."""
    args = parse_args(argv)
    daemon = Dockerd()
    daemon.ensure()  # started here on demand: stopped again when this script exits
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        work_root = args.work_root or Path(tmp)
        version = daemon.status().get("version")
        print(f"publish x {args.envs} environments per mode, scale {args.scale}, "
              f"{args.rounds} rounds; dockerd {version} at {daemon.socket}")  # fmt: skip
        header = " ".join(f"{'r' + str(k) + ' ms':>7}" for k in range(1, args.rounds + 1))
        print(f"mode    env  Ready ms | {header} |   sum ms  outcome")
        records: list[EnvironmentRecord] = []
        for index in range(args.envs):
            for record in run_pair(index, args, work_root):
                records.append(record)
                print(row(record), flush=True)
        print("\n".join(summary(records)))
    return 0 if all(r.outcome == "passed" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
