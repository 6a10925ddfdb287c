"""Run ``sandbench ARGS`` with the fleet's orchestration steps timed (for fleet_overhead.py).

Each step named in ``STEPS`` is a module attribute looked up at call time; it is wrapped so
that each call appends ``{"step", "t0", "t1", "pid"}`` (epoch seconds) to the JSON-lines file
named by ``$SANDBENCH_TRACE``. Nothing of the code under test changes: the wrappers are set
before the worker's pool forks. Run: python benchmarks/traced.py worker --host lab-a ...
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TRACE_ENV = "SANDBENCH_TRACE"
# step name -> (module, attribute path): on a lab host's worker, then on the coordinator
STEPS = {
    "spec verification": ("worker.gate", "check_spec"),
    "claim": ("worker.fleet", "claim_attempt"),
    "heartbeat start": ("worker.fleet", "_Heartbeat.__enter__"),
    "heartbeat stop": ("worker.fleet", "_Heartbeat.__exit__"),
    "flag check": ("worker.fleet", "RedisFailures.failed_before"),
    "runner": ("worker.gate", "run_environment"),
    "signing": ("worker.gate", "sign_record"),
    "reap check": ("worker.fleet", "reap_if_left"),
    "send": ("worker.fleet", "hand_over"),
    "provenance check": ("worker.fleet", "send_provenance"),
    "task": ("worker.fleet", "execute"),
    "coordinator verify": ("coordinator.fleet.coordinator", "Coordinator.check"),
    "append": ("coordinator.store.store", "Store.append_records"),
    "chain link": ("coordinator.store.hostlog", "linked_line"),
    "fsync": ("coordinator.fleet.intake", "sync_file"),
    "ack and stored mark": ("coordinator.fleet.intake", "Intake._commit"),
    "finalize check": ("coordinator.fleet.intake", "Intake._may_be_complete"),
    "intake batch": ("coordinator.fleet.intake", "Intake.handle"),
}


def timed(step: str, fn: Any) -> Any:
    """``fn`` that appends its call's start and end to the trace file."""
    path = os.environ[TRACE_ENV]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            t1 = time.time()
            line = json.dumps({"step": step, "t0": t0, "t1": t1, "pid": os.getpid()})
            with open(path, "a") as f:
                f.write(line + "\n")

    return wrapper


def install() -> None:
    """Wrap every step of ``STEPS`` whose module imports here."""
    for step, (module_name, attr) in STEPS.items():
        try:
            owner: Any = importlib.import_module(module_name)
            *outer, name = attr.split(".")
            for part in outer:
                owner = getattr(owner, part)
            setattr(owner, name, timed(step, getattr(owner, name)))
        except (ImportError, AttributeError):  # a tree without that step (an older one)
            continue


if __name__ == "__main__":
    install()
    from coordinator.cli import main

    sys.argv = ["sandbench", *sys.argv[1:]]
    main(prog_name="sandbench")
