"""A/A check of ``compare``: the same plan twice, compared; how often it finds a difference.

Two campaigns of one plan on one quiet machine differ only by chance, so a sound comparison
gives "no significant difference" for about 95% of their cells. This script runs ``--pairs``
pairs of campaigns of the plan below back to back (embedded ``sandbench run``, one key home),
compares each pair with ``coordinator.results.compare`` and prints:

* the false-verdict rate: A/A cells with a faster or slower verdict, with the count, and the
  cells withheld because the sentinel said the machine moved;
* the sentinel's view of each pair (calibration ratios B / A);
* the drift inside each campaign (``coordinator.results.trend``: each cell's change over the run
  order, ``*`` where it is significant after Holm's correction);
* with ``--effect``, a third campaign E per pair with a known injected effect, compared with B
  (the campaign just before it: the sides are as close in time as an A/A pair's).

The plan has the A/A modes and, per workload W, a command mode ``probe-W`` (native's payload
through ``env``, ``workloads = [W]``) whose ``sync`` helper runs ``sleep S`` inside each round's
clock. In A and B, S = 0; in E, S is ``EFFECT`` x the probe's median round time in B. Both
sides pay the same helper, so the probe cells of B vs E differ by exactly the sleep: a known
20% effect, found by the same between-campaign comparison as the A/A cells (E's other cells
are A/A cells too; they are not counted, being compared with the same B).

Targets (the issue's): at N = 10, at most 5% false verdicts over at least 24 A/A cells, and the
20% effect detected in at least 80% of its cells.

    .venv/bin/python benchmarks/aa.py [--pairs 2] [--effect] [--environments 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from coordinator.results.analysis import analyze_stored  # noqa: E402
from coordinator.results.compare import FASTER, SAME, SLOWER, WITHHELD, Cell, compare, load_side  # noqa: E402
from coordinator.results.trend import Trend, cell_trends  # noqa: E402
from coordinator.store.store import Store  # noqa: E402
from coordinator.store.trust import HostRegistry  # noqa: E402

WORKLOADS = ("publish", "seq-write", "create-small", "repo-inspect")
MODES = ("native", "host", "staged")
PROBE = "probe-"
ROUNDS = 3
SCALE = 0.05
EFFECT = 0.20
FALSE_TARGET, MIN_AA_CELLS, DETECT_TARGET = 0.05, 24, 0.80


def plan_text(name: str, environments: int, delays: dict[str, float] | None = None) -> str:
    """The plan, its probes sleeping ``delays[W]`` s a round (0 s without ``delays``)."""
    workloads = ", ".join(f'"{w}"' for w in WORKLOADS)
    modes = [f'"{m}"' for m in MODES] + [
        f'{{ name = "{PROBE}{w}", template = ["/usr/bin/env", "{{payload_argv}}"], '
        f'workloads = ["{w}"], sync = ["sleep", "{(delays or {}).get(w, 0.0):.6f}"] }}'
        for w in WORKLOADS
    ]
    return (
        f'name = "{name}"\nseed = 11\nscale = {SCALE}\nenvironments = {environments}\n'
        f"rounds = {ROUNDS}\nworkloads = [{workloads}]\nsentinel = true\n"
        f"modes = [{', '.join(modes)}]\n"
    )


@dataclass
class Lab:
    """Where the campaigns go: data directory, work root, key home."""

    data: Path
    work_root: Path
    home: Path

    def run(self, plan: str, label: str) -> str:
        """Run ``plan`` embedded; its campaign id."""
        path = self.data / f"aa-{label}.toml"
        path.write_text(plan)
        env = {**os.environ, "SANDBENCH_HOME": str(self.home)}
        argv = [sys.executable, "-m", "coordinator", "run", str(path), "--data", str(self.data),
                "--work-root", str(self.work_root), "--no-progress"]  # fmt: skip
        started = time.monotonic()
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                              check=False)  # fmt: skip
        last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        if done.returncode != 0 or not last.startswith("campaign: "):
            raise SystemExit(f"aa: campaign {label} did not finish cleanly (status "
                             f"{done.returncode}): {last}\n{done.stderr[-2000:]}")  # fmt: skip
        ident = last.removeprefix("campaign: ")
        print(f"  {label}: {ident} ({time.monotonic() - started:.0f} s)", flush=True)
        return ident

    def compare(self, a: str, b: str) -> tuple[list[Cell], list[str]]:
        """The compared cells of B against A and the sentinel's ratios."""
        store, registry = Store(self.data), HostRegistry(self.home / "hosts.json")
        c = compare(load_side(store, a, registry), load_side(store, b, registry))
        lines = [f"{r.workload} {r.ratio:.3f}x" for rs in c.sentinel.values() for r in rs]
        return c.cells, lines

    def analysis(self, campaign: str) -> object:
        """The stored campaign's analysis."""
        store = Store(self.data)
        return analyze_stored(store, store.campaign_view(campaign))[0]


def probe_rounds(lab: Lab, campaign: str) -> dict[str, float]:
    """Workload -> its probe's median environment task time / rounds (s) in ``campaign``."""
    (t,) = lab.analysis(campaign).tables  # type: ignore[attr-defined]
    rows = t.cells[t.cells["mode"].str.startswith(PROBE)]
    return {str(r.workload): float(r.task_s_median) / ROUNDS for r in rows.itertuples()}


def interval(x: Cell) -> str:
    """A cell's 95% interval, or why it has none."""
    if x.low is None or x.high is None:
        return "(N < 10)"
    return f"[{x.low:.3f}, {x.high:.3f}]"


def trend_lines(lab: Lab, campaign: str, label: str) -> tuple[list[str], int, int]:
    """Each cell's drift over the run order (``*``: significant; ``*m``: and the sentinel moved
    with it); how many are significant, and how many of those moved with the sentinel."""
    lines, flagged, explained = [], 0, 0
    analysis = lab.analysis(campaign)
    for t in analysis.tables:  # type: ignore[attr-defined]
        mine = analysis.sentinel_of(t.host, t.cohort)  # type: ignore[attr-defined]
        found = cell_trends(t.environments, None if mine is None else mine.points)
        flagged += sum(x.significant for x in found)
        explained += sum(x.significant and x.explained for x in found)
        shown = ", ".join(f"{x.mode}/{x.workload} {x.change:+.0%}{_mark(x)}" for x in found)
        lines.append(f"  trend {label}: {shown}")
    return lines, flagged, explained


def _mark(x: Trend) -> str:
    """``*`` significant, ``*m`` significant and moved with the sentinel (its change)."""
    if not x.significant:
        return ""
    return f"*m ({x.machine_text()})" if x.explained else "*"


def main() -> int:
    """Run the pairs, compare, print the rates beside the targets; exit 1 if one is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--environments", type=int, default=10, help="N per cell")
    parser.add_argument("--effect", action="store_true", help="add a campaign with a 20%% effect")
    parser.add_argument("--data", type=Path, default=REPO / ".data" / "aa")
    parser.add_argument("--work-root", type=Path, default=Path("/var/tmp/sandbench-aa"))
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    lab = Lab(args.data.resolve(), args.work_root, args.data.resolve() / "home")
    aa: list[Cell] = []
    effect: list[Cell] = []
    trended = with_sentinel = 0
    print(f"plan: {', '.join(WORKLOADS)} x {', '.join(MODES)} and a probe per workload, "
          f"N = {args.environments}, {ROUNDS} rounds, scale {SCALE}, sentinel on",
          flush=True)  # fmt: skip
    for pair in range(1, args.pairs + 1):
        print(f"pair {pair}:", flush=True)
        a = lab.run(plan_text(f"aa-{pair}", args.environments), f"{pair}a")
        b = lab.run(plan_text(f"aa-{pair}", args.environments), f"{pair}b")
        cells, sentinel_lines = lab.compare(a, b)
        aa += cells
        print(f"  sentinel B / A: {', '.join(sentinel_lines) or 'none'}")
        for ident, label in ((a, f"{pair}a"), (b, f"{pair}b")):
            lines, flagged, explained = trend_lines(lab, ident, label)
            trended += flagged
            with_sentinel += explained
            print("\n".join(lines))
        for x in cells:
            if x.verdict != SAME:
                print(f"  {x.mode_a}/{x.workload}: {x.verdict} {x.ratio:.3f}x {interval(x)}")
        if args.effect:
            # E against B, the campaign just before it: the two sides are as close in time as
            # an A/A pair's, so the machine's own shift between them is no larger
            delays = {w: EFFECT * m for w, m in probe_rounds(lab, b).items()}
            e = lab.run(plan_text(f"aa-{pair}", args.environments, delays), f"{pair}e")
            found, sentinel_lines = lab.compare(b, e)
            print(f"  sentinel E / B: {', '.join(sentinel_lines) or 'none'}")
            for x in found:
                if x.mode_a.startswith(PROBE):
                    effect.append(x)
                    print(f"  effect {x.workload}: sleep {delays[x.workload] * 1000:.2f} ms a "
                          f"round: {x.verdict} {x.ratio:.3f}x {interval(x)}")  # fmt: skip
    false = [x for x in aa if x.verdict in (FASTER, SLOWER)]
    withheld = [x for x in aa if x.verdict == WITHHELD]
    rate = len(false) / len(aa) if aa else 1.0
    ok = rate <= FALSE_TARGET and len(aa) >= MIN_AA_CELLS
    print(f"\nA/A false verdicts: {len(false)} of {len(aa)} cells = {rate:.1%} (target <= "
          f"{FALSE_TARGET:.0%} over >= {MIN_AA_CELLS} cells): {'met' if ok else 'MISSED'}; "
          f"withheld by the sentinel: {len(withheld)}")  # fmt: skip
    print(
        f"cells with a significant drift inside a campaign (Holm, 5%): {trended}, of which "
        f"{with_sentinel} moved with the sentinel"
    )
    if args.effect:
        hit = [x for x in effect if x.verdict == SLOWER]
        detect = len(hit) / len(effect) if effect else 0.0
        met = detect >= DETECT_TARGET
        ok = ok and met
        ratios = ", ".join(f"{r:.2f}" for r in sorted(x.ratio for x in effect))
        print(f"{EFFECT:.0%} effect detected: {len(hit)} of {len(effect)} cells = {detect:.0%} "
              f"(target >= {DETECT_TARGET:.0%}): {'met' if met else 'MISSED'}; measured ratios "
              f"{ratios}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
