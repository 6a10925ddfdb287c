"""The vm-virtiofs mode under TCG: real guests and a real virtiofsd in the environment's cgroup."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from contract.records import EnvironmentRecord, EnvironmentSpec
from tests.conftest import require
from tests.leftovers import NOTHING, leftovers, runs
from tests.test_vm_modes import (
    HOLD_LIMIT_S,
    LIMIT_S,
    SCALE,
    assert_clean,
    hung_before_ready,
    run_once_more_if_hung,
)
from worker import reaper, runner
from worker.cgroups import detect
from worker.ledger import ENVS_DIR
from worker.modes import get_mode
from worker.modes.base import EnvContext, HostInfo
from worker.modes.vm import VmVirtiofsMode
from worker.vm import guest, qemu, virtiofs

pytestmark = [pytest.mark.vm, pytest.mark.slow]

MODE = "vm-virtiofs"
CAMPAIGN = "c-vfs"  # environment (and cgroup) names start with "c-vfs_"
WORKLOADS = ("publish", "repo-inspect", "incremental-build")
POLL_S = 0.05


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work root shared by this module's environments (fixtures are built once)."""
    require(qemu.qemu_binary() is not None, "qemu-system-x86_64 (ops/setup.sh)")
    require(virtiofs.binary() is not None, f"{virtiofs.VIRTIOFSD} ({virtiofs.PACKAGE})")
    problem = get_mode(MODE).preflight(HostInfo())
    require(problem.ok, f"{MODE} preflight: {problem.reason}")
    return tmp_path_factory.mktemp("vfs-work")


def vfs_spec(root: Path, workload: str, **fields: Any) -> EnvironmentSpec:
    """An environment of vm-virtiofs under TCG at a small scale."""
    options = {"accel": "tcg", **fields.pop("options", {})}
    return EnvironmentSpec(
        campaign=CAMPAIGN, host="local", mode=MODE, workload=workload, env_index=0, scale=SCALE,
        limit_s=fields.pop("limit_s", LIMIT_S), work_root=str(root), mode_options=options,
        **fields,
    )  # fmt: skip


def daemons_serving(path: Path) -> list[int]:
    """Live virtiofsd processes whose shared directory is ``path`` or lies below it."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        argv = proc.info["cmdline"] or []
        serves = any(a.startswith(f"source={path}") for a in argv)
        alive = proc.info["status"] != psutil.STATUS_ZOMBIE
        if argv[:1] == [virtiofs.VIRTIOFSD] and serves and alive:
            found.append(proc.pid)
    return found


def outside_of(pid: int, cgroup_path: str) -> list[str]:
    """The lines of ``/proc/<pid>/cgroup`` for the quota's controllers (v1: cpu and memory;
    v2: the unified line) that are not in the environment's cgroup ``cgroup_path`` or below."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    if detect() == 2:
        relevant = [line for line in lines if line.startswith("0::")]
    else:
        quota = {"cpu", "memory"}
        relevant = [line for line in lines if quota & set(line.split(":")[1].split(","))]
    inside = cgroup_path.rstrip("/") + "/"
    return [line for line in relevant if not (line.split(":", 2)[2] + "/").startswith(inside)]


def assert_nothing_left(root: Path) -> None:
    """No environment directory, process, cgroup, mount, socket or virtiofsd lock file is left."""
    assert_clean(root)
    assert leftovers(root, f"{CAMPAIGN}_") == NOTHING
    assert not daemons_serving(root / ENVS_DIR)
    if virtiofs.LOCK_DIR.is_dir():
        locks = [p.name for p in virtiofs.LOCK_DIR.iterdir()]
        assert not [n for n in locks if n.startswith(f"{virtiofs.SOCKET_PREFIX}{CAMPAIGN}_")]


class ProbedVirtiofs(VmVirtiofsMode):
    """vm-virtiofs whose round sync also notes where this environment's virtiofsd runs."""

    def __init__(self) -> None:
        super().__init__("tcg")
        self.seen: dict[int, dict[int, list[str]]] = {}  # round -> pid -> lines outside

    def sync(self, env: EnvContext, round: int) -> None:
        """The mode's sync, then each of the environment's daemons' cgroup lines outside it."""
        super().sync(env, round)
        pids = daemons_serving(env.workspace)
        self.seen[round] = {pid: outside_of(pid, env.cgroup_path) for pid in pids}


@pytest.mark.parametrize("workload", WORKLOADS)
def test_virtiofs_passes_workload_with_virtiofsd_in_the_cgroup(
    root: Path, workload: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """vm-virtiofs passes the workload, oracle included; in every round the environment's
    virtiofsd (the daemon and its sandboxed child) runs in the environment's cgroup; after it
    nothing is left."""
    mode = ProbedVirtiofs()
    monkeypatch.setattr(runner, "get_mode", lambda name, options=None: mode)
    record = run_once_more_if_hung(vfs_spec(root, workload), capsys)
    assert record is not None
    assert record.outcome == "passed", (record.reason, record.detail)
    assert record.oracle is not None and record.oracle.ok
    assert record.exit_code == 0 and record.leftover_processes == 0
    assert record.ready_ms is not None and 0 < record.ready_ms < LIMIT_S * 1000
    assert [r.k for r in record.rounds] == [1, 2, 3]
    facts = record.provenance["preflight"]
    assert facts["workspace"] == "virtiofs" and facts["virtiofs_cache"] == "none"
    assert facts["virtiofsd"] == virtiofs.version() != ""
    assert sorted(mode.seen) == [1, 2, 3]
    for k, daemons in mode.seen.items():
        assert len(daemons) == 2, f"round {k}: virtiofsd processes {daemons}"  # parent, sandbox
        assert all(outside == [] for outside in daemons.values()), f"round {k}: {daemons}"
    assert_nothing_left(root)


def test_mmap_write_fails_as_documented(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """cache=none: the guest refuses a writable shared mapping of the workspace's file (ENODEV),
    so mmap-write is a round-error, as the mode's docstring and the README say."""
    record = run_once_more_if_hung(vfs_spec(root, "mmap-write"), capsys)
    assert record is not None
    assert (record.outcome, record.reason) == ("failed", "round-error"), record.detail
    assert "No such device" in (record.detail or ""), record.detail
    assert_nothing_left(root)


@pytest.mark.parametrize("workload", ["publish", "mmap-write"])
def test_the_writeback_variant_passes_mmap_write_too(
    root: Path, workload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """vm-virtiofs-writeback (cache=always with writeback, a guest sync each round) passes
    publish and the mmap-write that cache=none refuses; nothing is left."""
    spec = vfs_spec(root, workload).model_copy(update={"mode": "vm-virtiofs-writeback"})
    record = run_once_more_if_hung(spec, capsys)
    assert record is not None
    assert record.outcome == "passed", (record.reason, record.detail)
    assert record.oracle is not None and record.oracle.ok
    facts = record.provenance["preflight"]
    assert (facts["virtiofs_cache"], facts["virtiofs_writeback"]) == ("always", True)
    assert_nothing_left(root)


def test_the_limit_kills_virtiofsd_with_the_guest(root: Path) -> None:
    """A guest that never gets Ready is killed at the limit with its virtiofsd (seen serving
    the workspace while it held); no process, socket, lock file or cgroup is left."""
    spec = vfs_spec(root, "seq-write", limit_s=HOLD_LIMIT_S, options={"guest_hold": 1})
    seen: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(POLL_S):
            seen.update(daemons_serving(root / ENVS_DIR))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        record = runner.run_environment(spec)
    finally:
        done.set()
        watcher.join()
    assert isinstance(record, EnvironmentRecord)
    assert hung_before_ready(record), record.detail
    assert "workspace mounted (virtiofs)" in (record.detail or ""), record.detail
    assert len(seen) == 2, seen  # the daemon and its sandboxed child
    assert not [pid for pid in seen if runs(pid)]
    assert_nothing_left(root)


class MissingSource(VmVirtiofsMode):
    """vm-virtiofs whose virtiofsd is told to share a directory that does not exist."""

    def _attach_workspace(self, env: EnvContext, config: qemu.GuestConfig) -> None:
        """As the mode, with the workspace's path replaced by a missing one."""
        super()._attach_workspace(env, config)
        assert config.virtiofsd is not None
        config.virtiofsd = [
            f"source={env.workspace}-missing" if a.startswith("source=") else a
            for a in config.virtiofsd
        ]


def test_a_virtiofsd_that_cannot_start_is_a_launcher_error(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A virtiofsd that exits before its socket makes the launcher exit at once (no guest
    boots, no wait for the limit): launcher-error with the daemon's complaint."""
    mode = MissingSource("tcg")
    monkeypatch.setattr(runner, "get_mode", lambda name, options=None: mode)
    record = runner.run_environment(vfs_spec(root, "seq-write"))
    assert record is not None
    assert (record.outcome, record.reason) == ("failed", "launcher-error"), record.detail
    assert "virtiofsd exited (status" in (record.detail or ""), record.detail
    assert record.ready_ms is None and record.wall_s is not None and record.wall_s < 30
    assert_nothing_left(root)


def test_preflight_states_the_cache_mode_and_versions() -> None:
    """The preflight passes here and names QEMU's and virtiofsd's versions, the cache mode, the
    daemon's thread pool and sandbox."""
    require(guest.guest_problem(guest.load_guest()) is None, "prepared guest")
    verdict = get_mode(MODE).preflight(HostInfo())
    assert verdict.ok, verdict.reason
    facts = verdict.facts
    assert (facts["qemu"], facts["virtiofsd"]) == (qemu.qemu_version(), virtiofs.version())
    assert facts["virtiofs_cache"] == "none" and facts["workspace"] == "virtiofs"
    assert facts["virtiofsd_thread_pool_size"] == virtiofs.THREAD_POOL_SIZE
    assert facts["virtiofsd_sandbox"] == virtiofs.SANDBOX


def test_preflight_names_the_package_when_virtiofsd_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without virtiofsd the preflight fails and says which package to install."""
    monkeypatch.setattr(virtiofs, "VIRTIOFSD", str(tmp_path / "virtiofsd"))
    verdict = get_mode(MODE).preflight(HostInfo())
    assert not verdict.ok
    assert "virtiofsd not found" in verdict.reason and virtiofs.PACKAGE in verdict.reason
    assert "apt-get install qemu-system-x86" in verdict.reason


def test_the_reaper_removes_a_dead_environments_virtiofsd_lock(tmp_path: Path) -> None:
    """A dead environment's virtiofsd lock file (left by a runner killed with -9) is reaped."""
    name = f"{CAMPAIGN}_local_{MODE}_reaped-{tmp_path.name}"
    (tmp_path / ENVS_DIR / name / "env").mkdir(parents=True)
    lock = virtiofs.lock_file(virtiofs.socket_name(name))
    lock.parent.mkdir(mode=0o700, exist_ok=True)
    lock.write_text("4242\n")
    result = reaper.reap(tmp_path, engines=[])
    assert not lock.exists()
    assert ("file", str(lock)) in result.items and result.problems == []
