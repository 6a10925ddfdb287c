"""The launcher's cgroup join: what the shim waits for before every marker, per join file.

``worker.procs`` starts a small shell that writes "0" to each file of ``Cgroup.join_paths()``
and says so; the runner takes the marker once it has (``drive.join``). In cgroup v1 those are
the hierarchies' ``tasks`` files: a thread moving itself, which the kernel moves without its
global threadgroup lock; a write to ``cgroup.procs`` takes that lock, whose write side waits
for an RCU grace period. Per round, a fresh environment cgroup with the default quota, then a
shim into it through each kind of file, timed from its spawn to its "joined" (the exec of
``/bin/true`` after it is not timed). Figure: the median per kind, in ms. Target: the files
the runner uses (``join_paths``) at least 2 ms faster than ``cgroup.procs`` in v1 (on this
machine 2.1 ms against 7.8 ms); in v2 there is one kind and the figure is printed alone.

    .venv/bin/python benchmarks/cgroup_join.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.records import Quota  # noqa: E402  (after the sys.path line)
from worker import cgroups  # noqa: E402
from worker.procs import start_shim  # noqa: E402

TARGET_GAIN_MS = 2.0
PAUSE_S = 0.2  # between joins, so each finds the kernel's lock state idle, as a campaign does


class Through:
    """A cgroup whose join files are its own ``join_paths`` renamed to ``name``."""

    def __init__(self, cgroup: cgroups.Cgroup, name: str | None) -> None:
        self.cgroup, self.name = cgroup, name

    def join_paths(self) -> list[Path]:
        """The runner's join files, or the same directories' ``name`` files."""
        paths = self.cgroup.join_paths()
        return paths if self.name is None else [p.with_name(self.name) for p in paths]


def join_ms(cgroup: cgroups.Cgroup, name: str | None) -> float:
    """Milliseconds from the shim's spawn to its "joined", through ``name`` files."""
    started = time.monotonic()
    shim = start_shim(["/bin/true"], Through(cgroup, name))  # type: ignore[arg-type]
    spawned = shim.release()
    joined_ms = (spawned.marker_ns / 1e9 - started) * 1000
    spawned.proc.wait()
    return joined_ms


def main() -> int:
    """Time the joins; print the medians beside the target; exit 1 if it is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    version = cgroups.detect()
    kinds: dict[str, str | None] = {"join_paths": None}
    if version == 1:
        kinds["cgroup.procs"] = "cgroup.procs"
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    print(f"cgroup_join: cgroup v{version}, load average {os.getloadavg()[0]:.2f}, "
          f"{args.rounds} rounds")  # fmt: skip
    for i in range(args.rounds):
        for kind, name in kinds.items():
            cgroup = cgroups.create(f"bench-join-{os.getpid()}-{i}-{len(times[kind])}", Quota())
            try:
                times[kind].append(join_ms(cgroup, name))
            finally:
                cgroup.kill()
                cgroup.remove()
            time.sleep(PAUSE_S)
    medians = {kind: statistics.median(ms) for kind, ms in times.items()}
    runners = cgroups.new_cgroup("bench-join", version).join_paths()[0].name
    for kind, median in medians.items():
        label = f"join_paths ({runners})" if kind == "join_paths" else kind
        print(f"{label:<24} median {median:6.2f} ms  "
              f"(min {min(times[kind]):.2f}, max {max(times[kind]):.2f})")  # fmt: skip
    if "cgroup.procs" not in medians:
        return 0
    gain = medians["cgroup.procs"] - medians["join_paths"]
    met = gain >= TARGET_GAIN_MS
    print(f"gain {gain:.2f} ms per join; target >= {TARGET_GAIN_MS:g} ms: "
          f"{'met' if met else 'MISSED'}")  # fmt: skip
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
