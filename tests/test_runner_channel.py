"""The runner survives a payload that writes garbage, stalls or dies; stop and removal are safe."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from subprocess import PIPE
from typing import Any

import psutil
import pytest

from contract.errors import SandbenchError
from contract.records import EnvironmentRecord, EnvironmentSpec
from worker import cgroups
from worker.procs import close_pipes, spawn_marked, start_shim
from worker.runner import run_environment
from worker.workroot import remove_tree

READY = '{"op": "ready"}'


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work root shared by this module's environments."""
    return tmp_path_factory.mktemp("channel-work")


def spec(root: Path, template: str, **fields: Any) -> EnvironmentSpec:
    """A command-mode environment of seq-write at scale 0.02 with a shell ``template``."""
    return EnvironmentSpec(
        campaign="c-chan", host="local", mode="command", workload="seq-write", env_index=0,
        scale=0.02, work_root=str(root), mode_options={"template": template}, **fields,
    )  # fmt: skip


def run(root: Path, template: str, **fields: Any) -> tuple[EnvironmentRecord, float]:
    """Run one environment; the record and the wall time it took."""
    start = time.monotonic()
    record = run_environment(spec(root, template, **fields))
    assert record is not None
    assert not list((root / "envs").iterdir())
    return record, time.monotonic() - start


def test_garbage_instead_of_ready(root: Path) -> None:
    """A payload whose first line is not JSON is no-ready at once, not at the limit."""
    record, took = run(root, "echo 'Traceback: garbage'; exec sleep 61.1", limit_s=30)
    assert (record.outcome, record.reason) == ("failed", "no-ready")
    assert "not JSON" in (record.detail or "") and took < 10


def test_endless_line_in_a_round(root: Path) -> None:
    """A payload that floods its output without a newline is a round error, quickly."""
    template = f"echo '{READY}'; read line; head -c 3000000 /dev/zero; exec sleep 61.2"
    record, took = run(root, template, limit_s=30)
    assert (record.outcome, record.reason) == ("failed", "round-error")
    assert "longer than" in (record.detail or "") and took < 10


def test_payload_dies_in_a_round(root: Path) -> None:
    """A payload killed by a signal mid-round is a round error naming the exit status."""
    record, _ = run(root, f"echo '{READY}'; read line; kill -9 $$")
    assert (record.outcome, record.reason) == ("failed", "round-error")
    assert record.exit_code == -9 and "-9" in (record.detail or "")
    assert record.rounds == []


def test_wrong_answer_in_a_round(root: Path) -> None:
    """A well-formed but wrong answer (done for another round) is a round error."""
    template = f"""echo '{READY}'; read line; echo '{{"op": "done", "k": 7}}'; sleep 61.3"""
    record, _ = run(root, template, limit_s=30)
    assert (record.outcome, record.reason) == ("failed", "round-error")
    assert "unexpected answer" in (record.detail or "")


def test_stop_kills_cleans_and_returns_none(root: Path) -> None:
    """Setting the stop event mid-environment kills the tree, removes everything, returns None."""
    stop = threading.Event()
    timer = threading.Timer(1.0, stop.set)
    timer.start()
    start = time.monotonic()
    record = run_environment(spec(root, f"echo '{READY}'; exec sleep 61.4"), stop=stop)
    timer.join()
    assert record is None and time.monotonic() - start < 10
    assert not list((root / "envs").iterdir())
    assert not [p for p in psutil.process_iter(["cmdline"]) if "61.4" in (p.info["cmdline"] or [])]
    parent = cgroups.new_cgroup("x")
    leftovers = [p for p in _cgroup_parent(parent).iterdir() if p.name.startswith("c-chan")]
    assert leftovers == []


def _cgroup_parent(group: cgroups.Cgroup) -> Path:
    """The /sandbench directory of the hierarchy that lists processes."""
    directory = group.dirs["pids"] if hasattr(group, "dirs") else group.dir  # type: ignore[attr-defined]
    return Path(directory).parent


def test_stop_before_start(root: Path) -> None:
    """A stop event already set means nothing runs and no record is made."""
    stop = threading.Event()
    stop.set()
    assert run_environment(spec(root, "{payload_argv}"), stop=stop) is None


def test_removal_refuses_paths_outside_the_work_root(tmp_path: Path) -> None:
    """remove_tree deletes inside the work root only, even through a symlink."""
    work_root, outside = tmp_path / "work", tmp_path / "precious"
    work_root.mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (work_root / "escape").symlink_to(outside)
    for path in (outside, work_root, work_root / "escape", work_root / ".." / "precious"):
        with pytest.raises(SandbenchError, match="refusing to delete"):
            remove_tree(path, work_root)
    assert (outside / "keep.txt").read_text() == "keep"
    (work_root / "env" / "deep").mkdir(parents=True)
    assert remove_tree(work_root / "env", work_root) == []
    assert not (work_root / "env").exists()


def test_spawn_marked_joins_before_the_marker() -> None:
    """The launcher is already in its cgroup when it execs, and the marker precedes the exec."""
    group = cgroups.create(cgroups.cgroup_name("test-spawn"), None)
    try:
        before = time.monotonic_ns()
        proc, marker, _ = spawn_marked(["/bin/cat", "/proc/self/cgroup"], group, stdout=PIPE)
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode == 0 and before <= marker <= time.monotonic_ns()
        assert group.path in out.decode()
        with pytest.raises(FileNotFoundError):
            spawn_marked(["/nonexistent/launcher"], group)
    finally:
        group.remove()


def test_a_shim_started_ahead_joins_then_waits_and_can_be_abandoned() -> None:
    """``start_shim`` alone: the shim joins the cgroup on its own and waits there, running
    nothing, until released (the marker then follows the join, as in one step); abandoned
    unreleased, it is gone and its cgroup empty (an environment prepared ahead, then skipped)."""
    group = cgroups.create(cgroups.cgroup_name("test-shim-ahead"), None)
    try:
        shim = start_shim(["/bin/cat", "/proc/self/cgroup"], group, stdout=PIPE)
        deadline = time.monotonic() + 10
        while not group.pids() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert group.pids() == [shim.proc.pid] and shim.proc.poll() is None  # joined, waiting
        before = time.monotonic_ns()
        proc, marker, _ = shim.release()
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode == 0 and before <= marker <= time.monotonic_ns()
        assert group.path in out.decode()
        other = start_shim(["/bin/true"], group, stdout=PIPE)
        other.abandon()
        assert other.proc.returncode is not None and group.pids() == []
        close_pipes(other.proc)
    finally:
        group.remove()


def test_the_launcher_is_the_shims_exec_with_nothing_extra(tmp_path: Path) -> None:
    """The launcher replaces the shim in the same process (the caller's child) and inherits
    only its standard streams, not the handshake's pipes."""
    group = cgroups.create(cgroups.cgroup_name("test-shim"), None)
    try:
        script = "import os; print(os.getppid(), sorted(os.listdir('/proc/self/fd')))"
        proc, _, _ = spawn_marked(["/usr/bin/python3", "-I", "-S", "-c", script], group,
                                  stdout=PIPE)  # fmt: skip
        out, _ = proc.communicate(timeout=10)
        parent, fds = out.decode().split(" ", 1)
        assert int(parent) == os.getpid() and proc.returncode == 0
        assert fds.strip() == "['0', '1', '2', '3']", "0-2 and listdir's own descriptor"
        with pytest.raises(FileNotFoundError):
            spawn_marked(["no-such-launcher-on-path"], group)
    finally:
        group.remove()


def test_the_cpu_time_before_the_join_is_the_gap_between_the_two_counts() -> None:
    """What the launched process used before joining (the shim's start, said by ``times``) is
    in its own ``getrusage`` and in no cgroup: the cgroup's time plus it is the process's own
    count, within the clocks' rounding (``times`` prints milliseconds) and its exit. A large
    environment makes the shim's start long enough to see (tens of ms, as under TCG)."""
    group = cgroups.create(cgroups.cgroup_name("test-prejoin"), None)
    env = {"PATH": os.environ["PATH"], **{f"SANDBENCH_PAD_{i}": "x" * 20 for i in range(4000)}}
    try:
        burn = ("import resource, time\n"
                "end = time.process_time() + 0.3\n"
                "while time.process_time() < end: pass\n"
                "r = resource.getrusage(resource.RUSAGE_SELF)\n"
                "print(r.ru_utime + r.ru_stime)")  # fmt: skip
        spawned = spawn_marked(["/usr/bin/python3", "-I", "-S", "-c", burn], group, stdout=PIPE,
                               env=env)  # fmt: skip
        out, _ = spawned.proc.communicate(timeout=30)
        own, in_group = float(out), group.cpu_seconds()
        assert spawned.prejoin_cpu_s >= 0.01, (spawned.prejoin_cpu_s, own, in_group)
        assert own - in_group >= 0.01, "the start before the join is in no cgroup"
        # the cgroup also holds the Python's exit after it printed its count (3-9 ms here, more
        # on a slower machine), so the sum may pass the process's own count by that, never fall
        # short of it by more than the rounding
        gap = in_group + spawned.prejoin_cpu_s - own
        assert -0.003 < gap < 0.015, (in_group, own, spawned)
    finally:
        group.remove()
