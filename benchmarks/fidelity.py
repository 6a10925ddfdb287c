"""Fidelity: is the harness invisible in the clocks? Runner vs a bare driver; Ready minus spawn.

1. Round clocks, per workload at full scale (default: the mechanism and workflow groups):
   ``--pairs`` pairs (default 10) of native environments per mechanism, ``--workflow-pairs``
   (default 40: at 10, a workflow's ratio moves by 2-3% from run to run) per workflow, of native
   environments, one through the runner and one through a bare driver (the payload spawned
   into a fresh cgroup with the same quota, a blocking readline, the clock from writing
   ``round k`` to reading ``done k``, ``check k`` outside it), in ABBA order, each on a fresh
   copy of the fixture synced to disk before it starts. Figure: the median over pairs of runner
   environment time / bare environment time (environment = sum of its rounds; the two of a pair
   run back to back, so slow drift of the machine cancels), with a 95% bootstrap interval over
   pairs that says how finely the machine resolves it (the verdict is on the figure itself).
   Targets: <= 1.01 for each workflow; the median of the mechanisms' ratios <= 1.03.
2. Ready minus spawn, per mode (native, host, staged, command, docker): ``--ready`` environments
   of each mode through the runner, each right after a bare spawn of ``python3 -I -S -c`` that
   prints the ready line, spawned and read exactly as the runner spawns and reads a launcher
   (``spawn_marked`` into a fresh cgroup of the same quota, the channel's arrival time).
   Figure: median of (Ready - that spawn). Target: native <= 3 ms.

Prints the machine and its load average before and after; exits 0 when every target is met,
1 when one is missed, 2 when an environment failed (a failure is never a time).

    .venv/bin/python benchmarks/fidelity.py [--pairs 10] [--workflow-pairs 40] [--ready 15]
        [--rounds 3]
        [--scale 1.0] [--workloads NAME|GROUP ...] [--modes MODE ...]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contract.records import EnvironmentSpec, Quota
from worker import cgroups
from worker.channel import Channel
from worker.modes import HostInfo, Preflight, get_mode
from worker.modes.native import python_version
from worker.procs import kill_process, owned_process, spawn_marked
from worker.runner import preflight_of, run_environment
from worker.workroot import syncfs
from workloads.drive import PAYLOAD_PYTHON, payload_argv
from workloads.fixtures import copy_fixture, ensure_fixture
from workloads.registry import WORKLOADS, resolve

SEED = 1
QUOTA = Quota()  # the design's quota, for the runner and the bare driver alike
WORKFLOW_TARGET, MECHANISM_TARGET, READY_TARGET_MS = 1.01, 1.03, 3.0
READY_MODES: dict[str, dict[str, object]] = {
    "native": {},
    "host": {},
    "staged": {},
    "command": {"template": ["nice", "-n", "0", "{payload_argv}"]},
    "docker": {},
}
READY_WORKLOAD, READY_SCALE = "seq-write", 0.02
SPAWN_ARGV = [PAYLOAD_PYTHON, "-I", "-S", "-c", 'print(\'{"op": "ready"}\')']
ANSWER_TIMEOUT_S = 600.0


class EnvironmentFailed(Exception):
    """A runner or bare environment did not pass: the benchmark has no figure for it."""


# -- 1. round clocks: the runner vs a bare driver --------------------------------------------
def fresh_workspace(root: Path, fixture: Path) -> Path:
    """A new copy of ``fixture`` under ``root``, synced to disk."""
    workspace = Path(tempfile.mkdtemp(prefix="bare-", dir=root)) / "workspace"
    copy_fixture(fixture, workspace)
    syncfs(workspace)
    return workspace


def bare_environment(name: str, scale: float, rounds: int, root: Path) -> float:
    """One environment driven bare: the sum of its round times (s)."""
    fixture = ensure_fixture(name, SEED, scale, root / "fixtures")
    workspace = fresh_workspace(root, fixture)
    group = cgroups.create(cgroups.cgroup_name("fidelity-bare"), QUOTA)
    try:
        with owned_process(
            payload_argv(name, SEED, scale, workspace), group, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=workspace.parent,
        ) as proc:  # fmt: skip
            return _drive_bare(proc, rounds)
    finally:
        group.remove()
        shutil.rmtree(workspace.parent)


def _drive_bare(proc: subprocess.Popen[bytes], rounds: int) -> float:
    """Ready, check 0, then per round: the timed request and answer, the untimed check."""
    assert proc.stdin is not None and proc.stdout is not None
    if b'"ready"' not in proc.stdout.readline():
        raise EnvironmentFailed("bare payload: no ready line")
    _ask(proc, b'{"op": "check", "k": 0}\n', b'"checked"')
    total_ns = 0
    for k in range(1, rounds + 1):
        start = time.monotonic_ns()
        _ask(proc, b'{"op": "round", "k": %d}\n' % k, b'"done"')
        total_ns += time.monotonic_ns() - start
        if b'"validated": true' not in _ask(proc, b'{"op": "check", "k": %d}\n' % k, b'"checked"'):
            raise EnvironmentFailed(f"bare payload: round {k} not validated")
    proc.stdin.write(b'{"op": "exit"}\n')
    proc.stdin.close()
    if proc.wait(ANSWER_TIMEOUT_S) != 0:
        raise EnvironmentFailed(f"bare payload exited {proc.returncode}")
    return total_ns / 1e9


def _ask(proc: subprocess.Popen[bytes], request: bytes, op: bytes) -> bytes:
    """Write one request line, read one answer line; it must be ``op``."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(request)
    proc.stdin.flush()
    answer = proc.stdout.readline()
    if op not in answer:
        raise EnvironmentFailed(f"bare payload answered {answer[:200]!r} to {request!r}")
    return answer


@functools.cache
def mode_verdict(mode: str, options: str) -> Preflight:
    """The preflight of ``mode`` with its ``options`` (JSON), asked once for the whole run."""
    return preflight_of(get_mode(mode, json.loads(options)), HostInfo())


def runner_environment(
    mode: str, name: str, scale: float, rounds: int, root: Path, index: int,
    options: dict[str, object] | None = None,
) -> tuple[float, float]:  # fmt: skip
    """One environment through the runner: (sum of its round times in s, Ready in ms)."""
    spec = EnvironmentSpec(
        campaign="c-fidelity", host="local", mode=mode, workload=name, env_index=index,
        seed=SEED, scale=scale, rounds=rounds, quota=QUOTA, work_root=str(root),
        mode_options=options or {},
    )  # fmt: skip
    record = run_environment(spec, preflight=mode_verdict(mode, json.dumps(spec.mode_options)))
    if record is None or record.outcome != "passed" or record.ready_ms is None:
        detail = record and f"{record.reason}: {record.detail}"
        raise EnvironmentFailed(f"{mode}/{name}: {detail}")
    return sum(r.task_s for r in record.rounds), record.ready_ms


@dataclass
class Clocks:
    """One workload's environment times through the runner and bare, in seconds."""

    name: str
    runner: list[float] = field(default_factory=list)
    bare: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """The median over pairs of runner time / bare time."""
        return paired_ratio(self.runner, self.bare)

    def interval(self, draws: int = 2000) -> tuple[float, float]:
        """A 95% percentile-bootstrap interval of ``ratio``, resampling whole pairs."""
        rng = random.Random(SEED)
        pairs = list(zip(self.runner, self.bare, strict=True))
        estimates = sorted(
            paired_ratio(*zip(*rng.choices(pairs, k=len(pairs)), strict=True)) for _ in range(draws)
        )
        return estimates[int(0.025 * draws)], estimates[int(0.975 * draws) - 1]


def paired_ratio(runner: Sequence[float], bare: Sequence[float]) -> float:
    """Median of runner[i] / bare[i]."""
    return statistics.median(r / b for r, b in zip(runner, bare, strict=True))


def round_clocks(name: str, args: argparse.Namespace, root: Path) -> Clocks:
    """Interleaved pairs (ABBA) of runner and bare environments of ``name``."""
    clocks = Clocks(name)
    ensure_fixture(name, SEED, args.scale, root / "fixtures")  # built once, before any clock
    workflow = WORKLOADS[name].group == "workflow"
    for pair in range(args.workflow_pairs if workflow else args.pairs):
        runner_first = pair % 2 == 0
        for through_runner in (runner_first, not runner_first):
            if through_runner:
                task_s, _ = runner_environment("native", name, args.scale, args.rounds, root, pair)
                clocks.runner.append(task_s)
            else:
                clocks.bare.append(bare_environment(name, args.scale, args.rounds, root))
    return clocks


def report_clocks(results: list[Clocks]) -> list[str]:
    """Print the round-clock table; the targets missed."""
    print(f"{'workload':<18} {'group':<10} {'runner s':>10} {'bare s':>10} {'ratio':>7}"
          f"  {'95% interval':>13}")  # fmt: skip
    missed, mechanisms = [], []
    for c in results:
        group = WORKLOADS[c.name].group
        print(f"{c.name:<18} {group:<10} {statistics.median(c.runner):>10.4f}"
              f" {statistics.median(c.bare):>10.4f} {c.ratio:>7.3f}"
              "  {:.3f}-{:.3f}".format(*c.interval()))  # fmt: skip
        if group == "workflow" and c.ratio > WORKFLOW_TARGET:
            missed.append(f"{c.name} ratio {c.ratio:.3f} > {WORKFLOW_TARGET}")
        mechanisms += [c.ratio] if group == "mechanism" else []
    if mechanisms:
        median = statistics.median(mechanisms)
        verdict = "met" if median <= MECHANISM_TARGET else "MISSED"
        print(f"mechanisms: median of {len(mechanisms)} ratios {median:.3f}"
              f" (target <= {MECHANISM_TARGET}) {verdict}")  # fmt: skip
        missed += [] if median <= MECHANISM_TARGET else [f"mechanisms' median ratio {median:.3f}"]
    workflows = [c for c in results if WORKLOADS[c.name].group == "workflow"]
    if workflows:
        text = ", ".join(f"{c.name} {c.ratio:.3f}" for c in workflows)
        print(f"workflows (target <= {WORKFLOW_TARGET} each): {text}")
    return missed


# -- 2. Ready minus the bare interpreter's spawn ----------------------------------------------
def spawn_ms() -> float:
    """Marker to first line of a bare interpreter, spawned and read as the runner does."""
    group = cgroups.create(cgroups.cgroup_name("fidelity-spawn"), QUOTA)
    try:
        proc, t0, _ = spawn_marked(
            SPAWN_ARGV, group, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, bufsize=0,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        channel = Channel(proc.stdin, proc.stdout)
        try:
            arrived = channel.receive(t0 + int(ANSWER_TIMEOUT_S * 1e9)).arrived_ns
        finally:
            channel.close()
            kill_process(proc, group)
            for pipe in (proc.stdin, proc.stdout):
                pipe.close()
        return (arrived - t0) / 1e6
    finally:
        group.remove()


def ready_minus_spawn(args: argparse.Namespace, root: Path) -> list[str]:
    """Print Ready, spawn and their difference per mode (interleaved); the targets missed."""
    modes = {m: READY_MODES.get(m, {}) for m in args.modes}
    runnable = {}
    for mode, options in modes.items():
        verdict = mode_verdict(mode, json.dumps(options))
        if verdict.ok:
            runnable[mode] = options
        else:
            print(f"{mode}: preflight failed, not measured: {verdict.reason}")
    pairs: dict[str, list[tuple[float, float]]] = {m: [] for m in runnable}
    for i in range(args.ready):
        for mode, options in runnable.items():
            spawn = spawn_ms()
            _, ready = runner_environment(mode, READY_WORKLOAD, READY_SCALE, 1, root, i, options)
            pairs[mode].append((ready, spawn))
    print(f"{'mode':<10} {'Ready ms':>9} {'spawn ms':>9} {'Ready-spawn':>12} {'min':>7} {'max':>7}")
    missed = []
    for mode, values in pairs.items():
        diffs = [r - s for r, s in values]
        median = statistics.median(diffs)
        print(f"{mode:<10} {statistics.median(r for r, _ in values):>9.2f}"
              f" {statistics.median(s for _, s in values):>9.2f} {median:>12.2f}"
              f" {min(diffs):>7.2f} {max(diffs):>7.2f}")  # fmt: skip
        if mode == "native" and median > READY_TARGET_MS:
            missed.append(f"native Ready - spawn {median:.2f} ms > {READY_TARGET_MS} ms")
    if "native" in pairs:
        met = "met" if not missed else "MISSED"
        print(f"native: median Ready - spawn (target <= {READY_TARGET_MS} ms) {met}")
    return missed


# -- the run ------------------------------------------------------------------------------
def machine() -> str:
    """This machine in one line: host, CPU, cores, kernel, Python."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                .splitlines() if line.startswith("model name")), "?")  # fmt: skip
    return (f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs, kernel {platform.release()}, "
            f"payload {PAYLOAD_PYTHON} ({python_version()})")  # fmt: skip


def load() -> str:
    """/proc/loadavg's three load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def parse() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10, help="runner/bare pairs per mechanism")
    parser.add_argument("--workflow-pairs", type=int, default=40, help="... per workflow")
    parser.add_argument("--ready", type=int, default=15, help="environments per mode for Ready")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--workloads", nargs="*", default=["mechanism", "workflow"],
                        help="names or groups (none: skip the round clocks)")  # fmt: skip
    parser.add_argument("--modes", nargs="*", default=list(READY_MODES),
                        help="modes for Ready (none: skip Ready)")  # fmt: skip
    return parser.parse_args()


def main() -> int:
    """Both measurements in a private work root under /var/tmp; the exit status."""
    args = parse()
    print(f"sandbench fidelity, {time.strftime('%Y-%m-%d %H:%M %Z')}, {machine()}")
    print(f"load average at start: {load()}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="sandbench-fidelity-", dir="/var/tmp"))
    missed: list[str] = []
    try:
        names = resolve(args.workloads) if args.workloads else []
        if names:
            print(
                f"\nRound clocks: native, scale {args.scale}, {args.rounds} rounds, "
                f"runner/bare pairs (ABBA) {args.pairs} per mechanism, {args.workflow_pairs}"
                " per workflow; s per environment"
            )
            missed += report_clocks([round_clocks(name, args, root) for name in names])
        if args.modes:
            print(f"\nReady minus spawn: {args.ready} environments per mode ({READY_WORKLOAD},"
                  f" scale {READY_SCALE}), each after a bare spawn; ms")  # fmt: skip
            missed += ready_minus_spawn(args, root)
    except EnvironmentFailed as exc:
        print(f"FAILED environment, no figure: {exc}")
        return 2
    finally:
        shutil.rmtree(root, ignore_errors=True)
        print(f"\nload average at end: {load()}")
    print("all targets met" if not missed else "targets MISSED: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
