"""Fuzz: the properties of tests/test_fuzz_inputs.py with many more examples, counted.

Generated plan files through ``plan show`` and ``run``, and a real small campaign damaged one
file at a time through ``verify``, ``report`` and ``compare``: every example is run (a failure
does not stop the search), and the script prints how many it tried and how many failed, with
the distinct problems. Exit 1 if any example failed. Each example is a subprocess or two, so
5,000 examples per property take hours; --examples sets the count.

``--fork`` runs each command in a child forked from this process, with the command line's
modules already imported: the same ``main`` as ``python -m coordinator``, its output and exit
code taken the same way (an exception that escapes it is printed as a traceback and exits 1, as
the interpreter would), without paying an interpreter start and the imports per command. Each
child starts from the same state, so no example sees another's.

Run: .venv/bin/python benchmarks/fuzz_inputs.py [--examples N] [--only plans|campaigns] [--fork]
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

from tests.test_fuzz_inputs import (  # noqa: E402
    TIMEOUT_S,
    Damage,
    Lab,
    Runner,
    campaign_problem,
    damages,
    make_lab,
    plan_files,
    plan_problem,
    sandbench,
)

DEFAULT_EXAMPLES = 5000


class Tally:
    """Examples tried and the problems found, by their first line."""

    def __init__(self, name: str) -> None:
        self.name, self.tried, self.failed = name, 0, 0
        self.problems: Counter[str] = Counter()
        self.first: dict[str, str] = {}

    def note(self, problem: str | None) -> None:
        """Count one example and its problem, if any."""
        self.tried += 1
        if problem is not None:
            self.failed += 1
            head = problem.splitlines()[0]
            self.problems[head] += 1
            self.first.setdefault(head, problem)

    def lines(self, seconds: float) -> list[str]:
        """The summary: counts, then each distinct problem with its first example."""
        out = [f"{self.name}: tried {self.tried}, failed {self.failed} ({seconds:.0f} s)"]
        for head, n in self.problems.most_common():
            out.append(f"  {n} x {self.first[head]}")
        return out


def warm() -> None:
    """Import every module of the command line (and what it imports) before any fork."""
    import coordinator  # imported here so that only --fork pays for it

    for info in pkgutil.walk_packages(coordinator.__path__, "coordinator."):
        if not info.name.endswith(".__main__"):  # that one runs the command line
            importlib.import_module(info.name)


def forked(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``sandbench ARGS`` in a forked child with ``home`` as SANDBENCH_HOME (see --fork)."""
    from coordinator.cli import main  # imported by warm() before the first fork

    with tempfile.TemporaryDirectory() as scratch:
        out_path, err_path = Path(scratch, "out"), Path(scratch, "err")
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT, 0o600)
                err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT, 0o600)
                os.dup2(out_fd, 1)
                os.dup2(err_fd, 2)
                os.environ.update(SANDBENCH_HOME=str(home), COLUMNS="160")
                os.chdir(REPO)
                try:
                    main(args=list(args), prog_name="sandbench")
                    code = 0
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                except BaseException:  # noqa: BLE001 - what the interpreter would print
                    traceback.print_exc()
                    code = 1
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired(["sandbench", *args], TIMEOUT_S)
            time.sleep(0.002)
        code = os.waitstatus_to_exitcode(status)
        out = out_path.read_text(errors="replace")
        err = err_path.read_text(errors="replace")
    return subprocess.CompletedProcess(["sandbench", *args], code, out, err)


def explore(strategy: Any, check: Callable[[Any], str | None], examples: int) -> None:
    """Run ``check`` on ``examples`` generated examples; nothing stops or shrinks the search."""
    fuzz = settings(max_examples=examples, deadline=None, database=None,
                    phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip

    @fuzz
    @given(strategy)
    def run(example: Any) -> None:
        check(example)

    run()


def fuzz_plans(examples: int, runner: Runner) -> Tally:
    """Plan files through plan show and run."""
    tally = Tally("plan files (plan show, run)")

    def check(content: bytes) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            tally.note(plan_problem(Path(scratch), content, runner))

    explore(plan_files, check, examples)
    return tally


def fuzz_campaigns(examples: int, root: Path, runner: Runner) -> Tally:
    """One damaged file of a real campaign through verify, report or compare."""
    lab: Lab = make_lab(root / "lab")
    tally = Tally("damaged campaigns (verify, report, compare)")

    def check(d: Damage) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            tally.note(campaign_problem(lab, Path(scratch), d, runner))

    explore(damages, check, examples)
    return tally


def main() -> int:
    """Run the properties; exit 1 if an example failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES, help="per property")
    parser.add_argument("--only", choices=("plans", "campaigns"), default=None)
    parser.add_argument("--fork", action="store_true", help="fork each command (see above)")
    args = parser.parse_args()
    runner: Runner = forked if args.fork else sandbench
    if args.fork:
        warm()
    print(f"examples per property: {args.examples}; commands run "
          f"{'in forked children' if args.fork else 'as subprocesses'}", flush=True)  # fmt: skip
    failed = 0
    with tempfile.TemporaryDirectory() as root:
        for name in ("plans", "campaigns"):
            if args.only not in (None, name):
                continue
            started = time.monotonic()
            if name == "plans":
                tally = fuzz_plans(args.examples, runner)
            else:
                tally = fuzz_campaigns(args.examples, Path(root), runner)
            print("\n".join(tally.lines(time.monotonic() - started)), flush=True)
            failed += tally.failed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
