"""`sandbench modes list` and `sandbench env run` as subprocesses: records, verdicts, bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from contract.records import SCHEMA_VERSION
from tests.conftest import files_of
from worker.modes import mode_names

READY_LINE = '{"op": "ready"}'


def sandbench(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m coordinator`` with ``args``."""
    return subprocess.run(
        [sys.executable, "-m", "coordinator", *args], capture_output=True, text=True, timeout=300
    )


def test_modes_list_json() -> None:
    """modes list --json names every built-in mode and the command mode, each with a verdict."""
    done = sandbench("modes", "list", "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert set(rows) == {*mode_names(), "command"}
    for name in ("native", "host", "staged"):
        assert rows[name]["ok"] is True
    for row in rows.values():
        assert row["ok"] is not False or row["reason"], row


def test_env_run_json_prints_a_passing_record(tmp_path: Path) -> None:
    """env run --json prints the design's record for a passing native environment."""
    done = sandbench(
        "env", "run", "--mode", "native", "--workload", "append-fsync", "--scale", "0.02",
        "--rounds", "2", "--work-root", str(tmp_path), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(done.stdout)
    assert record["schema"] == SCHEMA_VERSION and record["outcome"] == "passed"
    assert [r["k"] for r in record["rounds"]] == [1, 2] and record["ready_ms"] > 0
    assert record["mode"] == "native" and record["workload"] == "append-fsync"


def test_env_run_failure_exits_1(tmp_path: Path) -> None:
    """A failed environment prints its reason and exits 1."""
    done = sandbench(
        "env", "run", "--mode", "command", "--template", "{payload_argv}; exit 4",
        "--workload", "seq-write", "--scale", "0.02", "--work-root", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 1
    assert "nonzero-exit" in done.stdout


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (["--mode", "nativ", "--workload", "seq-write"], "did you mean 'native'"),
        (["--mode", "native", "--workload", "seqwrite"], "seq-write"),
        (["--mode", "native", "--workload", "seq-write", "--scale", "-1"], "(0, 1]"),
        (["--mode", "native", "--workload", "seq-write", "--limit-s", "0"], "must be positive"),
        (["--mode", "native", "--workload", "seq-write", "--limit-s", "inf"], "must be positive"),
        (["--mode", "native", "--workload", "seq-write", "--rounds", "0"], "give 1 to"),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path: Path, args: list[str], fix: str) -> None:
    """Unknown mode or workload, negative scale, limit 0: one error line naming the fix, exit 2."""
    done = sandbench("env", "run", *args, "--work-root", str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sandbench: error:") and fix in lines[0]
    assert not (tmp_path / "envs").exists()


def test_env_run_ctrl_c_cleans_up(tmp_path: Path) -> None:
    """Ctrl-C during env run kills the environment, removes its files and exits 130."""
    marker = "62.5"
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator", "env", "run", "--mode", "command", "--template",
         f"echo '{READY_LINE}'; exec sleep {marker}", "--workload", "seq-write",
         "--scale", "0.02", "--work-root", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not _running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err and not _running(marker)
    assert not list((tmp_path / "envs").iterdir())


def _running(marker: str) -> bool:
    """Whether a process with ``marker`` in its command line is alive."""
    return any(marker in (p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))


def test_env_run_refuses_a_work_root_that_is_a_file(tmp_path: Path) -> None:
    """--work-root naming a regular file, or a path below one: one line, exit 2, nothing made."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    before = files_of(tmp_path)
    for root in (blocker, blocker / "below" / "it"):
        done = sandbench(
            "env", "run", "--mode", "native", "--workload", "publish", "--scale", "0.02",
            "--rounds", "1", "--work-root", str(root),
        )  # fmt: skip
        assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
        assert done.stderr == (
            f"sandbench: error: --work-root {root}: {blocker} is not a directory; give a "
            "directory (one that does not exist yet is created)\n"
        )
    assert files_of(tmp_path) == before
