"""Workloads are declared once: the catalog's checks, and a 20th added as the README says."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import REPO
from workloads import catalog, kit
from workloads.registry import WORKLOADS

PACKAGES = ("coordinator", "contract", "worker", "workloads")
FAMILIES = 'FAMILIES = ("writes", "reads", "working_set", "workflow")'


def test_every_declaration_says_what_its_clock_covers() -> None:
    """Each workload's round function has a docstring with a "Clock:" line."""
    for name, workload in WORKLOADS.items():
        assert "\n    Clock: " in (workload.round.__doc__ or ""), name


def test_declarations_are_consistent() -> None:
    """Numbers run 1..N in listing order; groups and sections are known; scale 1 is the table."""
    assert [w.number for w in WORKLOADS.values()] == list(range(1, len(WORKLOADS) + 1))
    for workload in WORKLOADS.values():
        assert workload.group in kit.GROUPS and workload.section in kit.SECTIONS
        assert workload.params(1.0) == workload.full_params


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"number": 21}, "without gaps"),
        ({"number": 19}, "without gaps"),
        ({"name": "publish", "number": 20}, "declared twice"),
        ({"number": 20, "section": "misc"}, "section"),
    ],
)
def test_catalog_refuses_a_bad_declaration(change: dict[str, object], message: str) -> None:
    """A 20th declaration with a gap, a repeat, a taken name or an unknown section is refused."""
    fields = {**catalog.DECLARED["publish"].fields(), "name": "extra", **change}
    extra = kit.Declaration(**fields)  # type: ignore[arg-type]
    modules = (*catalog.MODULES, SimpleNamespace(DECLARED=(extra,)))
    with pytest.raises(kit.PayloadError, match=message):
        catalog.collect(modules)


def readme_example() -> tuple[str, str]:
    """The example workload module of the README's "Adding a workload": (file name, code)."""
    section = (REPO / "README.md").read_text().split("## Adding a workload", 1)[1]
    name = re.search(r"such as `workloads/(\w+\.py)`", section)
    code = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert name and code, "the README's Adding a workload section lost its example"
    return name.group(1), code.group(1)


def add_readme_workload(copy: Path) -> None:
    """Apply the README's two code changes to a copy of the packages."""
    filename, code = readme_example()
    (copy / "workloads" / filename).write_text(code)
    module = filename.removesuffix(".py")
    path = copy / "workloads" / "kit.py"
    text = path.read_text()
    assert FAMILIES in text
    path.write_text(text.replace(FAMILIES, f'{FAMILIES[:-1]}, "{module}")'))


def test_a_twentieth_workload_takes_two_code_changes(tmp_path: Path) -> None:
    """The README's example added to a copy: listed as the 20th and passing natively through the
    runner, its payload in the environment and the oracle."""
    copy = tmp_path / "src"
    for package in PACKAGES:
        shutil.copytree(
            REPO / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    add_readme_workload(copy)

    def sandbench(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "coordinator", *args], cwd=copy, capture_output=True,
            text=True, timeout=300, check=False,
        )  # fmt: skip

    listed = sandbench("workloads", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert len(rows) == 20 and rows[-1]["name"] == "symlink-farm" and rows[-1]["number"] == 20
    done = sandbench(
        "env", "run", "--mode", "native", "--workload", "symlink-farm", "--scale", "0.1",
        "--work-root", str(tmp_path / "work"), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(done.stdout)
    assert record["outcome"] == "passed" and record["oracle"]["ok"]
    assert [r["validated"] for r in record["rounds"]] == [True, True, True]
