"""Preparation of fresh workspaces on a reflink file system (Btrfs) against a plain copy (ext4).

Two sparse images of the same size on the same disk, one Btrfs and one ext4, loop-mounted as
work roots. The largest workloads run as native environments at full scale, alternating
between the two, and the runner's own ``phases.prepare_s`` (workspace copy, cgroup, syncfs) is
compared: target, preparation on Btrfs at most half of ext4's (the sum of the per-workload
medians). Every environment must pass; a failed one makes the script exit 1.

    .venv/bin/python benchmarks/workspace_prep.py [--envs 3] [--scale 1.0] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.records import EnvironmentSpec  # noqa: E402
from worker.runner import run_environment  # noqa: E402
from workloads.fixtures import ensure_fixture  # noqa: E402

WORKLOADS = ("ws1024-w1", "ws256-w4", "read-large", "copy-tree", "repo-inspect")
FILESYSTEMS = ("btrfs", "ext4")
IMAGE_BYTES = 6 << 30
TARGET_RATIO = 0.5
Times = dict[tuple[str, str], list[tuple[float, float]]]  # (workload, fs) -> (prepare, cleanup)


@contextmanager
def loop_mounted(
    directory: Path, fstype: str, options: list[str] | None = None, name: str | None = None
) -> Iterator[Path]:
    """A fresh sparse image of ``fstype`` (made with mkfs ``options``) mounted under
    ``directory`` as ``name`` (default: the type's name)."""
    name = name or fstype
    image, mount = directory / f"{name}.img", directory / name
    with open(image, "wb") as f:
        f.truncate(IMAGE_BYTES)
    force = ["-F"] if fstype == "ext4" else ["-f"]
    argv = [f"mkfs.{fstype}", "-q", *force, *(options or []), str(image)]
    subprocess.run(argv, check=True, capture_output=True)
    mount.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def prepare_s(
    root: Path, workload: str, index: int, args: argparse.Namespace
) -> tuple[tuple[float, float], str]:
    """Preparation and cleanup seconds of one native environment (it must pass), its copy."""
    spec = EnvironmentSpec(
        campaign="bench-workspace-prep", host="local", mode="native", workload=workload,
        env_index=index, seed=1, scale=args.scale, rounds=args.rounds, work_root=str(root),
    )  # fmt: skip
    record = run_environment(spec)
    if record is None or record.outcome != "passed":
        why = record and f"{record.reason}: {record.detail}"
        raise SystemExit(f"{workload} on {root}: {why}")
    phases = (record.model_extra or {})["phases"]
    seconds = (float(phases["prepare_s"]), float(phases["cleanup_s"]))
    return seconds, str(record.provenance.get("workspace_copy"))


def measure(roots: dict[str, Path], args: argparse.Namespace) -> tuple[Times, dict[str, str]]:
    """Seconds per (workload, fs), alternating the file systems; how each fs copied."""
    for root in roots.values():  # fixtures are built before, never timed
        for workload in WORKLOADS:
            ensure_fixture(workload, 1, args.scale, root / "fixtures")
    times: Times = {}
    copies: dict[str, str] = {}
    for index in range(args.envs):
        for workload in WORKLOADS:
            for fs in FILESYSTEMS if index % 2 == 0 else FILESYSTEMS[::-1]:
                seconds, copies[fs] = prepare_s(roots[fs], workload, index, args)
                times.setdefault((workload, fs), []).append(seconds)
    return times, copies


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print one row per workload, then the total against the target."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=3, help="environments per workload and fs")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("needs root (loop mounts)")
    with (
        tempfile.TemporaryDirectory(prefix="sandbench-prep-", dir="/var/tmp") as tmp,
        loop_mounted(Path(tmp), "btrfs") as btrfs,
        loop_mounted(Path(tmp), "ext4") as ext4,
    ):
        times, copies = measure({"btrfs": btrfs, "ext4": ext4}, args)
    print(f"workspace preparation, native, scale {args.scale}, {args.envs} environments each; "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"copies: btrfs {copies['btrfs']}, ext4 {copies['ext4']}")
    print(f"{'workload':<14} {'prepare: btrfs s':>17} {'ext4 s':>8} {'ratio':>6}"
          f" {'cleanup: btrfs s':>17} {'ext4 s':>8}")  # fmt: skip
    total = {(fs, i): 0.0 for fs in FILESYSTEMS for i in (0, 1)}
    for workload in WORKLOADS:
        med = {(fs, i): statistics.median(t[i] for t in times[(workload, fs)])
               for fs in FILESYSTEMS for i in (0, 1)}  # fmt: skip
        for slot, value in med.items():
            total[slot] += value
        print(f"{workload:<14} {med['btrfs', 0]:>17.3f} {med['ext4', 0]:>8.3f} "
              f"{med['btrfs', 0] / med['ext4', 0]:>6.2f} {med['btrfs', 1]:>17.3f} "
              f"{med['ext4', 1]:>8.3f}")  # fmt: skip
    ratio = total["btrfs", 0] / total["ext4", 0]
    verdict = "met" if ratio <= TARGET_RATIO else "MISSED"
    print(f"{'total':<14} {total['btrfs', 0]:>17.3f} {total['ext4', 0]:>8.3f} {ratio:>6.2f} "
          f"{total['btrfs', 1]:>17.3f} {total['ext4', 1]:>8.3f}")  # fmt: skip
    print(f"preparation on btrfs / ext4 = {ratio:.2f} (target <= {TARGET_RATIO}: {verdict})")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
