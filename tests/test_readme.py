"""Every single-machine example command in the README runs and exits 0."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SANDBENCH = str(Path(sys.executable).parent / "sandbench")
# Examples a test can run on any machine as they stand; the fleet, compose and install examples
# need other machines and are exercised by the fleet tests in their own form.
RUNNABLE = {"modes", "env", "plan", "workloads"}


def readme_commands() -> list[list[str]]:
    """The ``.venv/bin/sandbench`` command lines of the README's ``sh`` blocks, as argv."""
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv[:1] == [".venv/bin/sandbench"] and argv[1] in RUNNABLE:
                commands.append([SANDBENCH, *argv[1:]])
    return commands


def test_readme_has_the_two_commands_near_the_top() -> None:
    """The README carries the main-job and test-suite commands before its first long section."""
    head = (REPO / "README.md").read_text()[:1500]
    assert "bash ops/setup.sh && .venv/bin/sandbench run --preset smoke" in head
    assert "bash ops/test.sh" in head
    assert (REPO / ".ci" / "run").read_text().strip().endswith("exec bash ops/test.sh")


def test_readme_has_runnable_examples() -> None:
    """The README shows at least the modes list and two env runs."""
    assert len(readme_commands()) >= 3


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda a: " ".join(a[1:4]))
def test_readme_example_runs(argv: list[str], tmp_path: Path) -> None:
    """A README example command exits 0 when run as written."""
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{argv}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
