"""KVM: a forced accelerator that cannot work fails at preflight with the probe's real reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from contract.records import EnvironmentSpec
from tests.conftest import require
from worker import hostinfo, provenance
from worker.modes import get_mode
from worker.modes.base import EnvContext, HostInfo
from worker.runner import run_environment
from worker.vm import accel, guest, qemu

pytestmark = [pytest.mark.vm]

SLACK_S = 10.0  # QEMU start, the preflight's own queries, a busy shared machine


@pytest.fixture
def fresh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> guest.Guest:
    """The prepared guest seen from a private home without a cached verdict (so it probes)."""
    require(qemu.qemu_binary() is not None, "qemu-system-x86_64 (ops/setup.sh)")
    prepared = guest.load_guest()
    require(guest.guest_problem(prepared) is None, f"prepared guest: {guest.vm_home()}")
    assert prepared is not None
    home = tmp_path / "vm"
    home.mkdir()
    for path in (prepared.vmlinuz, prepared.initrd, prepared.home / guest.MANIFEST):
        (home / path.name).symlink_to(path)
    monkeypatch.setenv("SANDBENCH_VM_HOME", str(home))
    private = guest.load_guest()
    assert private is not None and accel.cached_verdict(private) is None
    return private


def test_forced_kvm_fails_preflight_with_the_probe_reason(fresh_home: guest.Guest) -> None:
    """accel = "kvm" where the KVM probe fails: preflight says why, within the probe's bound."""
    start = time.monotonic()
    verdict = get_mode("vm", {"accel": "kvm"}).preflight(HostInfo())
    elapsed = time.monotonic() - start
    if verdict.ok:  # a host whose KVM works: forcing it is fine
        assert verdict.facts["accel"] == "kvm"
        return
    problem = verdict.facts["kvm_unusable"]
    assert verdict.reason.startswith('accel = "kvm" is forced but KVM is unusable here:')
    assert problem in verdict.reason
    if os.path.exists("/dev/kvm"):  # the probe booted: its reason is QEMU's or the console's
        assert "QEMU" in problem or "no ready line within" in problem, problem
    else:
        assert problem == accel.NO_KVM_DEVICE
    assert elapsed < accel.KVM_PROBE_S + SLACK_S  # the KVM probe's bound, never a full limit


def test_forced_kvm_environment_fails_at_once(fresh_home: guest.Guest, tmp_path: Path) -> None:
    """An environment forced onto an unusable KVM fails at preparation, not after its limit."""
    works = accel.kvm_problem(fresh_home) is None
    spec = EnvironmentSpec(
        campaign="c-kvm", host="local", mode="vm", workload="publish", env_index=0, scale=0.02,
        work_root=str(tmp_path / "work"), mode_options={"accel": "kvm"}, limit_s=90.0,
    )  # fmt: skip
    start = time.monotonic()
    record = run_environment(spec)
    assert record is not None
    if works:  # a host whose KVM works: the environment runs under it
        assert record.outcome == "passed", record.detail
        return
    assert time.monotonic() - start < accel.KVM_PROBE_S + SLACK_S
    assert (record.outcome, record.failure_class) == ("failed", "startup")
    assert "KVM is unusable here" in (record.detail or "")


def test_fallback_reason_in_status_and_provenance(fresh_home: guest.Guest) -> None:
    """After the probe, vm status and the host's provenance carry the verdict and KVM's reason."""
    verdict = accel.detect_accel(fresh_home)
    out = subprocess.run(
        [sys.executable, "-m", "coordinator", "vm", "status", "--json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    status = json.loads(out)
    facts = hostinfo.accelerator()
    assert status["accel"] == facts["accel"] == verdict["accel"]
    collected = provenance.collect("local", Path("/var/tmp"), campaign="c-kvm", seed=0,
                                   cohort="default", quota={})  # fmt: skip
    assert collected["accelerator"] == facts  # what every host's provenance.json carries
    if verdict["accel"] == "kvm":
        assert status["kvm_unusable"] is None and facts["kvm_unusable"] is None
    else:
        reason = accel.fallback_reason(verdict)
        assert reason and status["kvm_unusable"] == facts["kvm_unusable"] == reason
        assert "kvm: no ready" in status["accel_probe"] or not os.path.exists("/dev/kvm")


def test_the_probe_verdict_picks_the_qemu_accelerator(tmp_path: Path) -> None:
    """A VM environment's QEMU runs with the probe's accelerator: -accel kvm -cpu host where
    KVM reached Ready, multi-threaded TCG otherwise."""
    require(qemu.qemu_binary() is not None, "qemu-system-x86_64 (ops/setup.sh)")
    prepared = guest.load_guest()
    require(guest.guest_problem(prepared) is None, f"prepared guest: {guest.vm_home()}")
    assert prepared is not None
    verdict = accel.detect_accel(prepared)  # the cached verdict (ops/setup.sh probed)
    spec = EnvironmentSpec(
        campaign="c-kvm", host="local", mode="vm", workload="publish", env_index=0, scale=0.02,
        work_root=str(tmp_path),
    )  # fmt: skip
    for name in ("ws", "env"):
        (tmp_path / name).mkdir()
    env = EnvContext(spec, tmp_path / "ws", tmp_path / "env", "/sandbench/unused")
    mode = get_mode("vm", {})
    mode.prepare(env)
    try:
        argv = mode.launcher(env)
        kvm_argv = qemu.qemu_argv(replace(env.state["vm_config"], accel="kvm"))
    finally:
        mode.cleanup(env)
    at = argv.index("-accel")
    if verdict["accel"] == "kvm":
        assert argv[at : at + 4] == ["-accel", "kvm", "-cpu", "host"]
    else:
        assert verdict["accel"] == "tcg" and argv[at + 1] == "tcg,thread=multi"
    at = kvm_argv.index("-accel")  # the same environment where the probe says KVM
    assert kvm_argv[at : at + 4] == ["-accel", "kvm", "-cpu", "host"]
