"""The four VM modes under TCG: real guests, real workloads, the oracle, the limit and cleanup."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import psutil
import pytest

from contract.records import EnvironmentRecord, EnvironmentSpec
from tests.conftest import require
from worker import runner
from worker.modes import get_mode
from worker.modes.base import EnvContext
from worker.modes.vm import VmMode, VmWritebackMode
from worker.vm import guest, qemu
from worker.vm.job import Job
from workloads.oracle import compare
from workloads.registry import get_workload

pytestmark = [pytest.mark.vm, pytest.mark.slow]

VM_MODES = ("vm", "vm-writeback", "vm-disk", "vm-microvm")
WORKLOADS = ("publish", "seq-write", "sync-write", "repo-inspect")
LIMIT_S = 180.0  # TCG on a shared 2-core machine: boots take 10-40 s
HOLD_LIMIT_S = 25.0
SCALE = 0.02
READY = '{"op": "ready"}'


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work root shared by this module's environments (fixtures are built once)."""
    require(qemu.qemu_binary() is not None, "qemu-system-x86_64 (ops/setup.sh)")
    problem = guest.guest_problem(guest.load_guest())
    require(problem is None, f"prepared guest: {problem}")
    return tmp_path_factory.mktemp("vm-work")


def vm_spec(root: Path, mode: str, workload: str, **fields: Any) -> EnvironmentSpec:
    """An environment of ``mode`` under TCG at a small scale."""
    options = {"accel": "tcg", **fields.pop("options", {})}
    return EnvironmentSpec(
        campaign="c-vm", host="local", mode=mode, workload=workload, env_index=0, scale=SCALE,
        limit_s=fields.pop("limit_s", LIMIT_S), work_root=str(root), mode_options=options,
        **fields,
    )  # fmt: skip


def live_processes_under(path: Path) -> list[str]:
    """Command lines of live processes that mention ``path`` (QEMU names its files there)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(path) in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(cmdline[:200])
    return found


def assert_clean(root: Path) -> None:
    """No environment directory, disk image or QEMU process is left."""
    assert not list((root / "envs").iterdir()), "environment files left behind"
    assert not list(root.rglob("*.ext4")), "a disk image was left behind"
    assert not live_processes_under(root / "envs"), "a QEMU process outlived its environment"


def hung_before_ready(record: EnvironmentRecord) -> bool:
    """Whether the environment's guest never sent Ready within the limit."""
    return record.reason == "timeout" and "reached before Ready" in (record.detail or "")


def run_once_more_if_hung(
    spec: EnvironmentSpec, capsys: pytest.CaptureFixture[str]
) -> EnvironmentRecord | None:
    """The environment's record; once more if its guest hung before Ready (a TCG boot flake).

    Under TCG on a shared 2-core host a guest boot very rarely hangs (one in a CI run of ~45
    boots, stop 18; none in 83 loaded boots and hundreds of probes here). The runner handles it
    as it must (timeout before Ready, cleaned up: test_guest_that_never_gets_ready_...), and it
    says nothing about the mode under test. The hung attempt is printed on the terminal with
    its console tail, so a flake stays visible; a second hang or any other failure fails.
    """
    record = runner.run_environment(spec)
    if record is not None and hung_before_ready(record):
        with capsys.disabled():
            print(f"\nNOTE {spec.mode}/{spec.workload}: guest hung before Ready, run once more: "
                  f"{record.detail}")  # fmt: skip
        assert_clean(Path(spec.work_root))
        record = runner.run_environment(spec)
    return record


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("mode", VM_MODES)
def test_vm_mode_passes_workload(
    root: Path, mode: str, workload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each VM mode passes the workload under TCG, oracle included, with Ready from the guest."""
    record = run_once_more_if_hung(vm_spec(root, mode, workload), capsys)
    assert record is not None
    assert record.outcome == "passed", (record.reason, record.detail)
    assert record.oracle is not None and record.oracle.ok
    assert record.exit_code == 0
    assert record.ready_ms is not None and 0 < record.ready_ms < LIMIT_S * 1000
    assert [r.k for r in record.rounds] == [1, 2, 3]
    facts = record.provenance["preflight"]
    assert facts["accel"] in ("kvm", "tcg") and facts["qemu"] == qemu.qemu_version()
    assert_clean(root)


class CheckedWriteback(VmWritebackMode):
    """vm-writeback whose sync compares the host's view with the model right after syncing."""

    seen: ClassVar[dict[int, list[str]]] = {}

    def sync(self, env: EnvContext, round: int) -> None:
        """The mode's sync, then the oracle on the host workspace for ``round`` rounds."""
        super().sync(env, round)
        model = get_workload(env.spec.workload).model(env.spec.seed, env.spec.scale, round)
        self.seen[round] = compare(env.workspace, model)


def test_writeback_sync_makes_the_round_visible_on_the_host(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """After vm-writeback's round sync the host sees every file of the round, byte for byte."""
    mode = CheckedWriteback()
    mode.seen = {}
    monkeypatch.setattr(runner, "get_mode", lambda name, options=None: mode)
    record = run_once_more_if_hung(vm_spec(root, "vm-writeback", "publish"), capsys)
    assert record is not None and record.outcome == "passed", record.detail
    assert mode.seen == {1: [], 2: [], 3: []}


class PayloadUnderTmp(VmMode):
    """vm whose payload directory is a copy under the host's /tmp (as in a checkout there)."""

    payload_copy = Path()

    def prepare(self, env: EnvContext) -> None:
        """Point the environment at the copy, then prepare as usual."""
        env.payload = self.payload_copy
        super().prepare(env)


def test_payload_under_host_tmp_is_seen_by_the_guest(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A payload under the host's /tmp, which the guest's own /tmp covers, still runs."""
    assert str(tmp_path).startswith("/tmp/")
    mode = PayloadUnderTmp()
    copy = tmp_path / "workloads"
    shutil.copytree(EnvContext.payload.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    mode.payload_copy = copy / "payload.py"
    monkeypatch.setattr(runner, "get_mode", lambda name, options=None: mode)
    record = run_once_more_if_hung(vm_spec(root, "vm", "seq-write"), capsys)
    assert record is not None and record.outcome == "passed", (record.reason, record.detail)


def test_guest_that_never_gets_ready_is_killed_at_the_limit(root: Path) -> None:
    """A guest whose init never starts the payload times out before Ready; nothing is left.

    The detail carries the guest console's tail: where the guest stopped (init's progress lines).
    """
    spec = vm_spec(root, "vm-disk", "seq-write", limit_s=HOLD_LIMIT_S, options={"guest_hold": 1})
    start = time.monotonic()
    record = runner.run_environment(spec)
    elapsed = time.monotonic() - start
    assert isinstance(record, EnvironmentRecord)
    assert (record.outcome, record.failure_class) == ("failed", "resource"), record.detail
    detail = record.detail or ""
    assert hung_before_ready(record), detail
    assert "guest console: " in detail and "workspace mounted (ext4)" in detail, detail
    assert detail.endswith("sandbench-init: holding: the payload is not started"), detail
    assert elapsed >= HOLD_LIMIT_S
    assert_clean(root)


def test_payload_exit_status_becomes_launcher_status(root: Path) -> None:
    """A guest payload that exits 5 after its ready line makes the launcher exit 5."""
    prepared = guest.load_guest()
    assert prepared is not None
    code = f"print({READY!r}, flush=True); raise SystemExit(5)"
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        work = Path(tmp)
        job = Job(workspace="/", kind="none", argv=["/usr/bin/python3", "-I", "-S", "-c", code])
        config = qemu.GuestConfig(
            kernel=prepared.vmlinuz, initrd=prepared.initrd, job=job.write(work / "job.sh"),
            console_log=work / "console.log", accel="tcg",
        )  # fmt: skip
        # stdin stays open: QEMU drops the guest's output once its stdio peer has gone away
        proc = subprocess.Popen(
            qemu.launcher_argv(config), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            code = proc.wait(timeout=LIMIT_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
            out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()  # type: ignore[union-attr]
    assert out.decode().splitlines()[0] == READY
    assert code == 5, err.decode()[-800:]


def test_vm_modes_listed_with_preflight_facts() -> None:
    """Every VM mode's preflight passes here and names the accelerator and QEMU version."""
    require(guest.guest_problem(guest.load_guest()) is None, "prepared guest")
    for name in VM_MODES:
        verdict = get_mode(name).preflight(runner.HostInfo())
        assert verdict.ok, verdict.reason
        assert verdict.facts["accel"] in ("kvm", "tcg")
        assert verdict.facts["guest_kernel"]
        json.dumps(verdict.facts)
