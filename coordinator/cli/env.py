"""``sandbench env run``: one environment of one mode and workload, printed as a record.

Exit status: 0 if the environment passed, 1 if it failed (the record says why), 2 for bad
input, 130 if interrupted (no record: the environment was killed and cleaned up).
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import click

from contract.errors import PlanError, WorkloadError
from contract.names import check_name
from contract.paths import DEFAULT_WORK_ROOT
from contract.records import EnvironmentRecord, EnvironmentSpec
from coordinator.plan.file import MAX_LIMIT_S
from worker.modes import get_mode
from worker.runner import run_environment
from worker.workroot import check_work_root
from workloads.kit import MAX_ROUNDS

EXIT_FAILED, EXIT_INTERRUPTED = 1, 130


@click.group("env")
def env_group() -> None:
    """Single environments, outside any campaign."""


@env_group.command("run")
@click.option("--mode", "mode", required=True, help="Mode name (see: sandbench modes list).")
@click.option("--workload", required=True, help="Workload name (see: sandbench workloads list).")
@click.option("--scale", type=float, default=1.0, show_default=True, help="Size factor in (0, 1].")
@click.option("--rounds", type=int, default=3, show_default=True, help="Rounds (1-10).")
@click.option("--limit-s", type=float, default=90.0, show_default=True, help="Limit in seconds.")
@click.option("--seed", type=int, default=0, show_default=True, help="Fixture seed.")
@click.option("--work-root", type=click.Path(path_type=Path), default=None,
              help=f"Where workspaces and fixtures go (default {DEFAULT_WORK_ROOT}).")  # fmt: skip
@click.option("--template", default=None, help="Command template (makes a command mode).")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
def run_env(
    mode: str, workload: str, scale: float, rounds: int, limit_s: float, seed: int,
    work_root: Path | None, template: str | None, as_json: bool,
) -> None:  # fmt: skip
    """Run one environment and print its record."""
    spec = build_spec(mode, workload, scale, rounds, limit_s, seed, work_root, template)
    record = _run_interruptible(spec)
    if record is None:
        click.echo("sandbench: interrupted; the environment was killed and removed", err=True)
        raise SystemExit(EXIT_INTERRUPTED)
    click.echo(json.dumps(record.to_json_dict(), indent=2) if as_json else summary(record))
    if record.outcome != "passed":
        raise SystemExit(EXIT_FAILED)


def build_spec(
    mode: str, workload: str, scale: float, rounds: int, limit_s: float, seed: int,
    work_root: Path | None, template: str | None,
) -> EnvironmentSpec:  # fmt: skip
    """A validated spec for one ad-hoc environment; bad input raises with the fix."""
    from workloads.registry import get_workload

    if not 0 < scale <= 1:
        raise WorkloadError(f"--scale {scale} is out of range: give a value in (0, 1], e.g. 0.02")
    if not 1 <= rounds <= MAX_ROUNDS:
        raise PlanError(f"--rounds {rounds} is out of range: give 1 to {MAX_ROUNDS}")
    if not 0 < limit_s <= MAX_LIMIT_S:  # also refuses nan and inf
        raise PlanError(
            f"--limit-s {limit_s} must be positive and at most {MAX_LIMIT_S}, e.g. --limit-s 90"
        )
    check_name(mode, "--mode")  # a command mode's name is free: it becomes a cgroup name
    options: dict[str, Any] = {"template": template} if template else {}
    get_mode(mode, options)  # unknown mode: ModeUnavailable naming the modes
    get_workload(workload)  # unknown workload: WorkloadError naming a near match
    root = check_work_root(work_root or DEFAULT_WORK_ROOT)  # before anything is made there
    return EnvironmentSpec(
        campaign=time.strftime("adhoc-%Y%m%d-%H%M%S"),
        host=check_name(socket.gethostname(), "this host's name"), mode=mode,
        workload=workload, env_index=0, seed=seed, scale=scale, rounds=rounds, limit_s=limit_s,
        work_root=str(root), mode_options=options,
    )  # fmt: skip


def _run_interruptible(spec: EnvironmentSpec) -> EnvironmentRecord | None:
    """Run the environment; Ctrl-C sets the runner's stop event instead of raising."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        return run_environment(spec, stop=stop)
    finally:
        signal.signal(signal.SIGINT, previous)


def summary(record: EnvironmentRecord) -> str:
    """A few human-readable lines about one record."""
    verdict: str = record.outcome
    if record.reason:
        verdict += f" ({record.failure_class}: {record.reason})"
    ready = f"{record.ready_ms:.1f} ms" if record.ready_ms is not None else "-"
    rounds = ", ".join(f"{r.task_s:.3f}" for r in record.rounds) or "-"
    lines = [
        f"{record.mode} / {record.workload} (scale {record.scale}): {verdict}",
        f"  ready {ready}; rounds [s] {rounds}; exit {record.exit_code}",
        f"  cpu {record.cpu_s} s; peak memory {record.peak_memory_bytes} B",
    ]
    if record.detail:
        lines.append(f"  detail: {record.detail}")
    return "\n".join(lines)


def register(main: click.Group) -> None:
    """Attach ``env`` to the main group."""
    main.add_command(env_group)
