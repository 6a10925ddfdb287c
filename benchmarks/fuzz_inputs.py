"""Fuzz: the properties of tests/test_fuzz_inputs.py with many more examples, counted.

Generated plan files through ``plan show`` and ``run``, and a real small campaign damaged one
file at a time through ``verify``, ``report`` and ``compare``: every example is run (a failure
does not stop the search), and the script prints how many it tried and how many failed, with
the distinct problems. Exit 1 if any example failed. Each example is a subprocess or two, so
5,000 examples per property take hours; --examples sets the count.

Run: .venv/bin/python benchmarks/fuzz_inputs.py [--examples N] [--only plans|campaigns]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

from tests.test_fuzz_inputs import (  # noqa: E402
    Damage,
    Lab,
    campaign_problem,
    damages,
    make_lab,
    plan_files,
    plan_problem,
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


def explore(strategy: Any, check: Callable[[Any], str | None], examples: int) -> None:
    """Run ``check`` on ``examples`` generated examples; nothing stops or shrinks the search."""
    fuzz = settings(max_examples=examples, deadline=None, database=None,
                    phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip

    @fuzz
    @given(strategy)
    def run(example: Any) -> None:
        check(example)

    run()


def fuzz_plans(examples: int) -> Tally:
    """Plan files through plan show and run."""
    tally = Tally("plan files (plan show, run)")

    def check(content: bytes) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            tally.note(plan_problem(Path(scratch), content))

    explore(plan_files, check, examples)
    return tally


def fuzz_campaigns(examples: int, root: Path) -> Tally:
    """One damaged file of a real campaign through verify, report or compare."""
    lab: Lab = make_lab(root / "lab")
    tally = Tally("damaged campaigns (verify, report, compare)")

    def check(d: Damage) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            tally.note(campaign_problem(lab, Path(scratch), d))

    explore(damages, check, examples)
    return tally


def main() -> int:
    """Run the properties; exit 1 if an example failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES, help="per property")
    parser.add_argument("--only", choices=("plans", "campaigns"), default=None)
    args = parser.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory() as root:
        for name in ("plans", "campaigns"):
            if args.only not in (None, name):
                continue
            started = time.monotonic()
            if name == "plans":
                tally = fuzz_plans(args.examples)
            else:
                tally = fuzz_campaigns(args.examples, Path(root))
            print("\n".join(tally.lines(time.monotonic() - started)), flush=True)
            failed += tally.failed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
