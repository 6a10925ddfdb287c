"""Ready and publish round times, native beside the container modes, from one run on this host.

Environments alternate native, docker, podman, native, ... so every mode sees the same machine
state. Ready in a container mode runs from the marker through ``docker start -ai`` or ``podman
start --attach --interactive`` (attach, container start) to the payload's ready line; the
container was created beforehand (preparation, not timed).

    .venv/bin/python benchmarks/containers_vs_native.py [--envs 5] [--scale 1.0] [--rounds 3]
        [--modes native,docker,podman]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.records import EnvironmentRecord, EnvironmentSpec  # noqa: E402
from worker.dockerd import Dockerd  # noqa: E402
from worker.podman import Podman  # noqa: E402
from worker.runner import run_environment  # noqa: E402

MODES = ("native", "docker", "podman")
WORKLOAD = "publish"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=5, help="environments per mode")
    parser.add_argument("--scale", type=float, default=1.0, help="publish workload scale")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per environment")
    parser.add_argument("--work-root", type=Path, default=None, help="default: a temporary dir")
    parser.add_argument("--modes", default=",".join(MODES), help="native first, then others")
    args = parser.parse_args(argv)
    args.modes = tuple(args.modes.split(","))
    if args.modes[0] != "native":
        parser.error("--modes must start with native (the others are compared to it)")
    return args


def run_pair(index: int, args: argparse.Namespace, work_root: Path) -> list[EnvironmentRecord]:
    """One environment of the publish workload in each mode."""
    records = []
    for mode in args.modes:
        spec = EnvironmentSpec(
            campaign="bench-containers-vs-native", host="local", mode=mode, workload=WORKLOAD,
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


def summary(records: list[EnvironmentRecord], modes: tuple[str, ...]) -> list[str]:
    """Per mode: Ready min/median/max, median round, median environment sum (passed only)."""
    lines = ["", "mode    n  Ready ms min / median / max   round ms median   env sum ms median"]
    medians: dict[str, tuple[float, float]] = {}
    for mode in modes:
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
    if "native" not in medians:
        return lines
    nr, ns = medians["native"]
    for mode, (dr, ds) in medians.items():
        if mode != "native":
            lines.append(f"{mode} - native: Ready {dr - nr:+.1f} ms, env sum {ds - ns:+.1f} ms "
                         f"(x{ds / ns:.2f})")  # fmt: skip
    return lines


def engines(modes: tuple[str, ...]) -> str:
    """The container engines' versions (a private dockerd is started on demand, if needed)."""
    parts = []
    if "docker" in modes:
        daemon = Dockerd()
        daemon.ensure()  # started here on demand: stopped again when this script exits
        parts.append(f"dockerd {daemon.status().get('version')} at {daemon.socket}")
    if "podman" in modes:
        store = Podman()
        store.setup()
        parts.append(f"podman {store.versions()['podman_version']} ({store.runtime}) at "
                     f"{store.state_dir}")  # fmt: skip
    return "; ".join(parts) or "no container mode"


def main(argv: list[str] | None = None) -> int:
    """Run the alternating environments and print the side-by-side table."""
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        work_root = args.work_root or Path(tmp)
        print(f"publish x {args.envs} environments per mode, scale {args.scale}, "
              f"{args.rounds} rounds; {engines(args.modes)}")  # fmt: skip
        header = " ".join(f"{'r' + str(k) + ' ms':>7}" for k in range(1, args.rounds + 1))
        print(f"mode    env  Ready ms | {header} |   sum ms  outcome")
        records: list[EnvironmentRecord] = []
        for index in range(args.envs):
            for record in run_pair(index, args, work_root):
                records.append(record)
                print(row(record), flush=True)
        print("\n".join(summary(records, args.modes)))
    return 0 if all(r.outcome == "passed" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
