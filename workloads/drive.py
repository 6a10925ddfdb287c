"""Drive the payload natively for R rounds: the simplest launcher, for tests and benchmarks."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PAYLOAD = Path(__file__).resolve().parent / "payload.py"
PAYLOAD_PYTHON = "/usr/bin/python3"
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
        """Every round done and validated, and a clean exit."""
        done = [m for m in self.lines if m.get("op") == "done"]
        return self.exit_code == 0 and bool(done) and all(m["validated"] for m in done)


def payload_argv(workload: str, seed: int, scale: float, root: Path) -> list[str]:
    """The isolated payload command line every mode uses."""
    return [
        PAYLOAD_PYTHON, "-I", "-S", str(PAYLOAD), "--workload", workload,
        "--seed", str(seed), "--scale", repr(float(scale)), "--root", str(root),
    ]  # fmt: skip


def drive(workload: str, seed: int, scale: float, root: Path, rounds: list[int]) -> Drive:
    """Run the payload on ``root`` and send the given round numbers, then exit."""
    result = Drive()
    proc = subprocess.Popen(
        payload_argv(workload, seed, scale, root),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin and proc.stdout
    try:
        result.lines.append(json.loads(proc.stdout.readline() or "null"))
        for k in rounds:
            start = time.monotonic()
            proc.stdin.write(json.dumps({"op": "round", "k": k}) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            result.round_s.append(time.monotonic() - start)
            result.lines.append(json.loads(line) if line else {"op": "eof"})
            if result.lines[-1].get("op") != "done":
                break
        else:
            proc.stdin.write('{"op": "exit"}\n')
            proc.stdin.flush()
        result.lines += [json.loads(x) for x in proc.stdout.read().splitlines() if x.strip()]
        proc.stdin.close()
        result.exit_code = proc.wait(EXIT_TIMEOUT_S)
        assert proc.stderr
        result.stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return result
