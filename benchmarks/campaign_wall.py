"""A campaign's wall time against its measured time: the figures issue 25's targets are read by.

Each configuration runs as a user runs it, ``sandbench run`` in a child process with its own
store, keys and work root, and its closing lines are read: the wall-time split (measured =
Ready and the round times; preparation; oracle and checks; cleanup; sentinel; the harness's
rest) and the largest unmeasured costs by mode, workload and step. Targets, measured share of
the wall time:

* ``full``: the 19 workloads at full scale in native and staged, N = 3 (ext4 work root): >= 70%;
* ``smoke``: the smoke preset: >= 80%;
* ``btrfs``: ``full`` on a loop-mounted Btrfs work root (reflink workspaces): >= 85%.

The fixtures (read-only, built once per host and work root) are built before each campaign, as
a lab host has them after its first campaign. The ext4 work roots are kept for their fixtures.
Their trash (``worker/trash.py``: on ext4 without a journal a campaign's removed workspaces are
renamed into it, deleted when it outgrows its budget or by ``sandbench host clean``) is emptied
after each campaign, and what that deletion took is printed beside the figures: work deferred
past the campaign, not done by nobody. An earlier run's trash found before a campaign is not
this campaign's to delete and is emptied before it. On ext4 without a journal a deletion then
slows every create near the freed inodes for 5 min 30 s (an inode freed in the last 30 s, or 5
min 30 s while its inode table block is dirty, which a create beside it makes it, is passed
over by every create, one buffer lookup each): a campaign started right after the trash was
emptied pays for that deletion in every workspace copy (2026-12-06: readdir-wide's copy 0.8-1.0
s against 0.19 s). So a campaign on such a work root starts only once ``REUSE_WINDOW_S`` has
passed since the benchmark's own last deletion on that file system, as a lab host's campaigns
find it when nobody emptied the trash minutes before (``--no-settle`` starts at once, as right
after ``host clean``). Every campaign must verify (``sandbench run`` verifies at its end), and
one that does not complete or verify prints no figure. Exit status: 0 every target met, 1 a
target missed, 2 a campaign failed. Nothing else should run on the machine meanwhile (2 cores).

    .venv/bin/python benchmarks/campaign_wall.py [--configs full smoke btrfs] [--n 3]
        [--scale 1.0] [--workloads ...] [--work-root DIR] [--no-settle]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.workspace_prep import loop_mounted  # noqa: E402
from coordinator.plan.file import SMOKE_SCALE  # noqa: E402
from worker import trash  # noqa: E402
from workloads.fixtures import ensure_fixture  # noqa: E402
from workloads.registry import WORKLOADS, Models  # noqa: E402

CONFIGS = ("full", "smoke", "btrfs")
TARGETS = {"full": 0.70, "smoke": 0.80, "btrfs": 0.85}
SEED = 1  # the plans' and the smoke preset's
ROUNDS = 3  # the plans'
RUN_TIMEOUT_S = 4 * 3600
WALL = re.compile(r"^wall time ([\d.]+) s: (.*); harness ([\d.]+) s", re.MULTILINE)
PART = re.compile(r"(measured|preparation|oracle and checks|cleanup|sentinel) ([\d.]+) s")
REUSE_WINDOW_S = 5.5 * 60 + 10  # ext4 without a journal: see the module's text
DELETED: dict[int, float] = {}  # device -> when this benchmark last deleted a trash there
AHEAD = re.compile(r"preparation done ahead, beside the environment before: ([\d.]+) s")


@dataclass
class Figures:
    """One campaign's wall time and its parts in seconds, and the costs it named."""

    wall_s: float
    parts: dict[str, float]
    harness_s: float
    largest: str
    ahead_s: float = 0.0  # preparation hidden beside the environment before (not in the parts)

    @property
    def measured_share(self) -> float:
        """The measured part's share of the wall time."""
        return self.parts["measured"] / self.wall_s if self.wall_s else 0.0


def full_plan(n: int, scale: float, workloads: list[str]) -> str:
    """The plan of ``full`` and ``btrfs``: the workloads in native and staged."""
    names = ", ".join(f'"{w}"' for w in workloads) if workloads else '"all"'
    return (f'name = "campaign-wall"\nseed = {SEED}\nenvironments = {n}\nrounds = {ROUNDS}\n'
            f'limit_s = 300\nscale = {scale}\nworkloads = [{names}]\n'
            'modes = ["native", "staged"]\n')  # fmt: skip


def build_fixtures(work_root: Path, workloads: list[str], scale: float) -> None:
    """The fixtures a campaign of ``workloads`` at ``scale`` (seed 1) copies, built now, with
    what a campaign keeps beside them (``workloads.facts``: their scans, the models of its
    rounds), as a lab host has both after its first campaign."""
    for name in workloads or list(WORKLOADS):
        fixture = ensure_fixture(name, SEED, scale, work_root / "fixtures")
        Models(keep=0).model(WORKLOADS[name], SEED, scale, ROUNDS, fixture)


def run_campaign(home: Path, work_root: Path, plan: Path | None) -> Figures | str:
    """Run one campaign through ``sandbench run``; its figures, or why there are none."""
    source = [str(plan)] if plan is not None else ["--preset", "smoke"]
    own = ["--data", str(home / "data"), "--work-root", str(work_root),
           "--key", str(home / "host.key"), "--registry", str(home / "hosts.json"),
           "--host-name", "bench"]  # fmt: skip
    argv = [sys.executable, "-m", "coordinator", "run", *source, *own, "--no-progress"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          check=False, cwd=REPO)  # fmt: skip
    out = done.stdout
    if done.returncode != 0 or "records: verified" not in out:
        tail = (out + done.stderr).strip().splitlines()[-6:]
        return f"exit status {done.returncode}, not verified: " + " | ".join(tail)
    wall = WALL.search(out)
    if wall is None:
        return "no wall-time line in sandbench run's output"
    parts = {name: float(s) for name, s in PART.findall(wall.group(2))}
    largest = next((x for x in out.splitlines() if x.startswith("largest unmeasured")), "")
    ahead = AHEAD.search(wall.group(2))
    return Figures(float(wall.group(1)), parts, float(wall.group(3)), largest,
                   float(ahead.group(1)) if ahead else 0.0)  # fmt: skip


def measure(config: str, args: argparse.Namespace, scratch: Path) -> Figures | str:
    """Run ``config`` in its own store under ``scratch``."""
    home = scratch / config
    home.mkdir()
    plan = None
    if config != "smoke":
        plan = home / "plan.toml"
        plan.write_text(full_plan(args.n, args.scale, args.workloads))
    scale = SMOKE_SCALE if config == "smoke" else args.scale
    workloads = [] if config == "smoke" else args.workloads
    if config == "btrfs":
        with loop_mounted(home, "btrfs") as root:
            build_fixtures(root / "work", workloads, scale)
            return run_campaign(home, root / "work", plan)
    work_root = args.work_root / f"campaign-wall-{config}"  # kept: its fixtures are reused
    build_fixtures(work_root, workloads, scale)
    emptied = empty_trash(work_root)
    if emptied[0]:
        print(f"{config}: emptied the trash earlier runs left: {emptied[0]} directories in "
              f"{emptied[1]:.1f} s (before the campaign, not in its figures)")  # fmt: skip
    if args.settle:
        settle(config, work_root)
    figures = run_campaign(home, work_root, plan)
    left, spent = empty_trash(work_root)
    if left:
        print(f"{config}: the campaign left {left} removed workspaces in the trash; deleting "
              f"them took {spent:.1f} s afterwards (deferred, not saved)")  # fmt: skip
    return figures


def empty_trash(work_root: Path) -> tuple[int, float]:
    """Empty ``work_root``'s trash: how many directories it held and the seconds it took."""
    held = trash.held(work_root)
    started = time.monotonic()
    if problems := trash.empty(work_root):
        raise SystemExit(f"campaign_wall: {'; '.join(problems)}")
    if held:
        DELETED[os.stat(work_root).st_dev] = time.monotonic()
    return held, time.monotonic() - started


def settle(config: str, work_root: Path) -> None:
    """Wait until ``REUSE_WINDOW_S`` has passed since this benchmark last deleted a trash on
    ``work_root``'s file system, if it is ext4 without a journal (module's text)."""
    deleted = DELETED.get(os.stat(work_root).st_dev)
    if deleted is None or not trash.defers(work_root):
        return
    if (wait := deleted + REUSE_WINDOW_S - time.monotonic()) > 0:
        print(f"{config}: waiting {wait:.0f} s before the campaign: on ext4 without a journal "
              "the inodes the trash just freed slow every create for 5 min 30 s")  # fmt: skip
        time.sleep(wait)


def report(config: str, figures: Figures) -> bool:
    """Print one configuration's figures beside its target; whether it is met."""
    share, target = figures.measured_share, TARGETS[config]
    split = ", ".join(f"{name} {s:.1f} s" for name, s in figures.parts.items())
    verdict = "met" if share >= target else "MISSED"
    print(f"{config:<6} wall {figures.wall_s:8.1f} s  measured {100 * share:5.1f}%  "
          f"target >= {100 * target:.0f}%: {verdict}")  # fmt: skip
    print(
        f"       {split}; harness {figures.harness_s:.1f} s; preparation done ahead "
        f"(beside the environment before, not in the parts) {figures.ahead_s:.2f} s"
    )
    if figures.largest:
        print(f"       {figures.largest}")
    return share >= target


def main() -> int:
    """Run the chosen configurations one after the other; print their figures and verdicts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--n", type=int, default=3, help="environments per cell (full, btrfs)")
    parser.add_argument("--scale", type=float, default=1.0, help="scale of full and btrfs")
    parser.add_argument("--workloads", nargs="*", default=[], help="default: all 19")
    parser.add_argument("--work-root", type=Path, default=Path("/var/tmp"),
                        help="the ext4 work roots' parent (default /var/tmp)")  # fmt: skip
    parser.add_argument("--no-settle", dest="settle", action="store_false",
                        help="start each campaign at once, even after a deletion")  # fmt: skip
    args = parser.parse_args()
    print(f"campaign_wall: load average at start {os.getloadavg()[0]:.2f}; "
          f"full = {args.n} x {len(args.workloads) or 19} workloads x native, staged "
          f"at scale {args.scale:g}")  # fmt: skip
    met, failed = True, False
    with tempfile.TemporaryDirectory(prefix="campaign-wall-", dir=args.work_root) as tmp:
        for config in args.configs:
            figures = measure(config, args, Path(tmp))
            if isinstance(figures, str):
                print(f"{config:<6} FAILED campaign, no figure: {figures}")
                failed = True
                continue
            met = report(config, figures) and met
    print(f"campaign_wall: load average at end {os.getloadavg()[0]:.2f}")
    return 2 if failed else 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
