"""Every command that refuses (exit 2) says why in one line and changes nothing on disk: the
home (keys, registry), the data directory and the work root are byte for byte as before.

plan show, run, verify, report and compare are fuzzed (tests/test_fuzz_inputs.py); run's and
env run's refusals and dispatch's are tested beside their commands. These are the others.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, files_of

SANDBENCH = [sys.executable, "-m", "coordinator"]
DEAD_BROKER = "redis://127.0.0.1:9/0"  # the discard port: nothing listens


def a_key() -> str:
    """A well-formed Ed25519 public key (32 bytes, base64)."""
    return base64.b64encode(os.urandom(32)).decode()


KEY = a_key()
# (name, argv after `sandbench`, what the one line must say); {home}, {data} and {work} are the
# test's own directories; the registry already trusts lab-a with KEY.
CASES = {
    "hosts add: not a key": (["hosts", "add", "lab-b", "not-base64!"], "key"),
    "hosts add: a bad name": (["hosts", "add", "lab/b", a_key()], "lab/b"),
    "hosts add: name taken by another key": (["hosts", "add", "lab-a", a_key()], "--replace"),
    "rerun: unknown task id": (["rerun", "c-20261202-0000-lab-a-1", "--broker", DEAD_BROKER,
                            "--data", "{data}"], "task id"),
    "status: dead broker": (["status", "c-20261202-0000", "--data", "{data}", "--broker",
                                  DEAD_BROKER], "broker"),
    "host clean: work root is a file": (["host", "clean", "--work-root", "{work}/file"], "file"),
    "env run: unknown mode": (["env", "run", "--mode", "natve", "--workload", "publish",
                               "--work-root", "{work}"], "natve"),
    "env run: scale out of range": (["env", "run", "--mode", "native", "--workload", "publish",
                                     "--scale", "7", "--work-root", "{work}"], "scale"),
    "plan show: missing file": (["plan", "show", "{work}/none.toml"], "none.toml"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_a_refusal_is_one_line_and_changes_nothing(tmp_path: Path, case: str) -> None:
    """The command exits 2 with one line naming what to fix; no file anywhere it owns moved."""
    home, data, work = tmp_path / "home", tmp_path / "data", tmp_path / "work"
    for directory in (home, data, work):
        directory.mkdir()
    (work / "file").write_text("not a directory\n")
    env = {**os.environ, "SANDBENCH_HOME": str(home)}
    added = subprocess.run([*SANDBENCH, "hosts", "add", "lab-a", KEY], env=env, cwd=REPO,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert added.returncode == 0, added.stderr
    argv, says = CASES[case]
    argv = [a.format(home=home, data=data, work=work) for a in argv]
    before = files_of(tmp_path)
    done = subprocess.run([*SANDBENCH, *argv], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert files_of(tmp_path) == before
