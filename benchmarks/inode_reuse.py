"""Why metadata work drifts inside a campaign on some disks: creates after deletions.

ext4 without a journal will not reuse an inode freed in the last 30 s (5 min 30 s while the
inode table block holding it is dirty): ``find_inode_bit`` calls ``recently_deleted`` for
every free inode it passes and skips the recent ones, one buffer-cache lookup each. A create
then costs in proportion to how many inodes were freed lately in its block group, so each
environment's removal (and a workload's own deletions) slows the creates of the environments
after it: the copies of the next workspaces and the measured creates of create-small and its
kind. With a journal (ext4's default) the check is not made.

This script shows it on three work roots side by side: the directory given (default: the
default work root's file system), and loop-mounted ext4 images on the same disk with and
without a journal. On each: create a tree of ``--deleted`` files, write it back, delete it,
write that back; then time ``--created`` creates (4 KiB files in fresh directories, as a
workspace copy makes them) at once, and again after the clean window (``--wait`` s) has
passed; and a baseline with no deletion before it. It prints the creates per second of each.

    .venv/bin/python benchmarks/inode_reuse.py [--dir /var/tmp] [--deleted 10000]
        [--created 5000] [--wait 35]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.workspace_prep import loop_mounted  # noqa: E402
from worker.hostinfo import work_root_journal  # noqa: E402
from worker.workroot import syncfs  # noqa: E402

PER_DIR = 500
BLOCK = b"x" * 4096


def make_tree(root: Path, files: int) -> None:
    """``files`` 4 KiB files under ``root``, ``PER_DIR`` to a directory."""
    for i in range(files):
        sub = root / f"d{i // PER_DIR}"
        if i % PER_DIR == 0:
            sub.mkdir(parents=True)
        (sub / f"f{i}").write_bytes(BLOCK)


def timed_creates(root: Path, files: int) -> float:
    """Creates per second of ``files`` new files (their write-back not counted)."""
    started = time.perf_counter()
    make_tree(root, files)
    rate = files / (time.perf_counter() - started)
    syncfs(root)
    return rate


def run_on(base: Path, args: argparse.Namespace) -> dict[str, float]:
    """The three rates on the file system holding ``base``."""
    work = Path(tempfile.mkdtemp(prefix="inode-reuse-", dir=base))
    try:
        rates = {"no deletion before": timed_creates(work / "baseline", args.created)}
        shutil.rmtree(work / "baseline")
        syncfs(work)
        time.sleep(args.wait)  # the baseline's own deletions out of the window
        make_tree(work / "doomed", args.deleted)
        syncfs(work)
        shutil.rmtree(work / "doomed")
        syncfs(work)
        rates["right after deleting"] = timed_creates(work / "after", args.created)
        time.sleep(args.wait)
        rates[f"{args.wait:.0f} s after"] = timed_creates(work / "later", args.created)
        return rates
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    """Measure on each file system and print the creates per second."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--deleted", type=int, default=10_000)
    parser.add_argument("--created", type=int, default=5_000)
    parser.add_argument("--wait", type=float, default=35.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the script loop-mounts two ext4 images")
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} load {os.getloadavg()[0]:.2f}, "
          f"{args.deleted} files deleted, {args.created} created")  # fmt: skip
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        roots = {f"{args.dir} ({work_root_journal(args.dir)})": args.dir}
        with (
            loop_mounted(Path(scratch), "ext4", ["-O", "has_journal"], "journal") as journal,
            loop_mounted(Path(scratch), "ext4", ["-O", "^has_journal"], "bare") as nojournal,
        ):
            roots[f"loop ext4 ({work_root_journal(journal)})"] = journal
            roots[f"loop ext4 ({work_root_journal(nojournal)})"] = nojournal
            for name, root in roots.items():
                rates = run_on(root, args)
                shown = ", ".join(f"{when} {rate:,.0f}/s" for when, rate in rates.items())
                print(f"{name}: creates {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
