"""Drive the payload natively for R rounds: the simplest launcher, for tests and benchmarks."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.environ import setting
from workloads import catalog

PAYLOAD = Path(__file__).resolve().parent / "payload.py"
PAYLOAD_PYTHON = setting("SANDBENCH_PYTHON") or "/usr/bin/python3"  # as every mode
EXIT_TIMEOUT_S = 30.0


@dataclass
class Drive:
    """What one native payload run answered: its lines, round times and exit status."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    round_s: list[float] = field(default_factory=list)
    exit_code: int | None = None
    stderr: str = ""

    @property
    def ok(self) -> bool:
        """Every round done and validated (its check after the clock), and a clean exit."""
        done = [m for m in self.lines if m.get("op") == "done"]
        checked = [m for m in self.lines if m.get("op") == "checked" and m["k"] > 0]
        return (
            self.exit_code == 0 and bool(done) and len(checked) == len(done)
            and all(m["validated"] for m in checked)
        )  # fmt: skip


def payload_argv(
    workload: str,
    seed: int,
    scale: float,
    root: Path | str,
    payload: Path | str = PAYLOAD,
    python: str = PAYLOAD_PYTHON,
) -> list[str]:
    """The isolated payload command line every mode uses (``--family``: the module that
    declares the workload, so that the payload imports that one alone; left out for a name
    nothing declares, which the payload then answers with its error)."""
    family = catalog.FAMILY.get(workload)
    return [
        python, "-I", "-S", str(payload), "--workload", workload,
        "--seed", str(seed), "--scale", repr(float(scale)), "--root", str(root),
        *(["--family", family] if family else []),
    ]  # fmt: skip


def drive(
    workload: str,
    seed: int,
    scale: float,
    root: Path,
    rounds: list[int],
    prefix: tuple[str, ...] = (),
    payload: Path = PAYLOAD,
) -> Drive:
    """Run the payload on ``root`` (after the launcher ``prefix``), send the rounds, then exit."""
    result = Drive()
    with subprocess.Popen(
        [*prefix, *payload_argv(workload, seed, scale, root, payload)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        try:
            _converse(proc, rounds, result)
            result.exit_code = proc.wait(EXIT_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.stderr
        result.stderr = proc.stderr.read()
    return result


def _converse(proc: subprocess.Popen[str], rounds: list[int], result: Drive) -> None:
    """Read ready, then per round: send it and time its answer, then ask for its check
    (outside the clock, as the runner does); send exit, collect the rest."""
    assert proc.stdin
    assert proc.stdout
    line = proc.stdout.readline()
    result.lines.append(json.loads(line) if line else {"op": "eof"})
    if not _ask(proc, {"op": "check", "k": 0}, result, "checked"):
        rounds = []
    for k in rounds:
        start = time.monotonic()
        answered = _ask(proc, {"op": "round", "k": k}, result, "done")
        result.round_s.append(time.monotonic() - start)
        check = {"op": "check", "k": k, "next": k != rounds[-1]}
        if not answered or not _ask(proc, check, result, "checked"):
            break
    else:
        _send(proc, '{"op": "exit"}')
    result.lines += [json.loads(x) for x in proc.stdout.read().splitlines() if x.strip()]
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()


def _ask(proc: subprocess.Popen[str], request: dict[str, Any], result: Drive, op: str) -> bool:
    """Send ``request``, keep its answer line; whether the answer is ``op``."""
    assert proc.stdout
    _send(proc, json.dumps(request))
    line = proc.stdout.readline()
    result.lines.append(json.loads(line) if line else {"op": "eof"})
    return bool(result.lines[-1].get("op") == op)


def _send(proc: subprocess.Popen[str], line: str) -> None:
    """Write one request line; a payload that already exited is seen on its stdout instead."""
    assert proc.stdin
    try:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
    except BrokenPipeError:
        pass


@dataclass
class NativeRun:
    """One native environment: fixture build time, the payload's answers and the oracle."""

    build_s: float
    drive: Drive
    mismatches: list[str]


def native_environment(
    workload: str, seed: int, scale: float, rounds: int, cache: Path, work: Path
) -> NativeRun:
    """Fixture (cached), fresh workspace ``work``, R rounds through the payload, then the oracle."""
    from workloads import fixtures, oracle
    from workloads.registry import get_workload

    start = time.monotonic()
    fixture = fixtures.ensure_fixture(workload, seed, scale, cache)
    build_s = time.monotonic() - start
    fixtures.copy_fixture(fixture, work)
    result = drive(workload, seed, scale, work, list(range(1, rounds + 1)))
    model = get_workload(workload).model(seed, scale, rounds, fixture=fixture)
    return NativeRun(build_s, result, oracle.compare(work, model))
