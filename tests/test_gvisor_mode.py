"""The gvisor mode for real: runsc on its bundle, the workloads, the sandbox inside, the quota
binding the Sentry and gofer, OOM, the limit, the reaper, and preflight's reasons."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from contract.records import EnvironmentSpec, Quota
from tests.conftest import REPO, mode_spec, require_binary
from tests.leftovers import NOTHING, hold, holding_python, leftovers
from tests.nsjail_probe import (
    ALLOCATING_PYTHON,
    BURNER,
    PROBE,
    executable,
    launch,
    probe_environment,
    reap_killed_runner,
    run_in_subprocess,
)
from worker.modes import get_mode
from worker.modes.base import EnvContext, HostInfo
from worker.modes.gvisor import GVISOR_DIR, LOG_FILE, GvisorMode, offered_platforms
from worker.procs import close_pipes
from worker.runner import run_environment
from workloads.catalog import DECLARED

SCALE = 0.02
GIB = 1 << 30
MEASURE_S = 4.0


def require_runsc() -> str:
    """runsc on PATH (ops/setup.sh installs it), or a reasoned skip (a failure in CI)."""
    return require_binary("runsc")


def spec_for(workload: str, work_root: Path, **fields: object) -> EnvironmentSpec:
    """A gvisor-mode environment of ``workload`` at the test scale."""
    return mode_spec("gvisor", workload, work_root, **fields)


def test_preflight_names_version_platform_and_flags() -> None:
    """Preflight passes with ptrace and names runsc's version, the platform and the flags."""
    require_runsc()
    verdict = get_mode("gvisor").preflight(HostInfo())
    assert verdict.ok, verdict.reason
    assert verdict.facts["runsc"].startswith("runsc version ")
    assert verdict.facts["platform"] == "ptrace" and "ptrace" in verdict.facts["platforms_offered"]
    flags = verdict.facts["runsc_flags"]
    assert "--platform=ptrace" in flags and "--ignore-cgroups" in flags
    assert "--network=none" in flags and "--overlay2=none" in flags


@pytest.mark.parametrize("workload", list(DECLARED))
def test_workload_passes(modes_root: Path, workload: str) -> None:
    """Every workload passes in the gvisor mode at scale 0.02, oracle and quota check included."""
    require_runsc()
    record = run_environment(spec_for(workload, modes_root))
    assert record is not None
    assert record.outcome == "passed", (record.reason, record.detail)
    assert record.oracle is not None and record.oracle.ok
    assert [r.k for r in record.rounds] == [1, 2, 3] and all(r.validated for r in record.rounds)
    assert record.provenance["preflight"]["platform"] == "ptrace"
    assert "cleanup" not in record.provenance, record.provenance["cleanup"]


@pytest.fixture
def probe_env(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[EnvContext]:
    """An environment whose payload is the script ``request.param``, with a real cgroup."""
    script, quota = request.param
    spec = spec_for("seq-write", tmp_path, quota=quota)
    with probe_environment(tmp_path, spec, script, quota, GvisorMode()) as env:
        yield env


def tree_of(pid: int) -> list[psutil.Process]:
    """``pid`` and its descendants."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


@pytest.mark.parametrize("probe_env", [(PROBE, Quota())], indirect=True)
def test_the_sandbox_inside(probe_env: EnvContext) -> None:
    """runsc, its gofer and the Sentry all run in the environment's cgroup; inside, the payload
    is PID 1 with only loopback, writes only the workspace and sees no cgroup files to leave
    by; nothing but the payload's lines is on the channel."""
    require_runsc()
    env, cgroup = probe_env, probe_env.state["cgroup"]
    proc = launch(env, GvisorMode())
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline()) == {"op": "ready"}
    tree = tree_of(proc.pid)
    names = {p.name() for p in tree}
    placed = {p.pid: cgroup.holds(p.pid) for p in tree}
    out, _ = proc.communicate(b"go\n", timeout=60)
    assert proc.returncode == 0
    lines = out.decode().splitlines()
    assert len(lines) == 1, lines
    seen = json.loads(lines[0])
    assert "runsc" in names and len(tree) >= 3, names  # runsc run, gofer, sandbox (Sentry)
    assert all(placed.values()), placed
    assert seen["pid"] == 1 and seen["hostname"] == "sandbench" and seen["net"] == ["lo"]
    assert seen["workspace"] == "ok" and (env.workspace / "inside.txt").exists()
    assert set(seen["outside"].values()) == {30}, seen["outside"]  # EROFS
    assert not seen["escapes"], seen["escapes"]  # gVisor shows no cgroupfs without --cgroupfs
    assert (env.env_dir / GVISOR_DIR / LOG_FILE).exists()


# The machine has 2 cores: a 2-core quota cannot be seen binding (DESIGN.md), half a core can.
@pytest.mark.parametrize("probe_env", [(BURNER, Quota(cpus="0", cpu_quota=0.5))], indirect=True)
def test_cpu_burner_is_held_to_the_quota(probe_env: EnvContext) -> None:
    """Four busy threads in the sandbox: the environment's cgroup gets at most half a core on
    CPU 0, and what it counts is the sandbox's work."""
    require_runsc()
    env, cgroup = probe_env, probe_env.state["cgroup"]
    proc = launch(env, GvisorMode())
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert json.loads(proc.stdout.readline()) == {"op": "ready"}
        time.sleep(1.0)
        wall0, cpu0 = time.monotonic(), cgroup.cpu_seconds()
        time.sleep(MEASURE_S)
        cpu = cgroup.cpu_seconds() - cpu0
        rate = cpu / (time.monotonic() - wall0)
        total_cgroup = cgroup.cpu_seconds()
        proc.stdin.write(b"stop\n")
        proc.stdin.flush()
        own = json.loads(proc.stdout.readline())["cpu_s"]
        affinity = {cpu for p in tree_of(proc.pid) for cpu in p.cpu_affinity()}
    finally:
        proc.kill()
        cgroup.kill()
        proc.wait(timeout=30)
        close_pipes(proc)
    print(f"gvisor CPU burner: {rate:.3f} cores under a 0.5-core quota (payload's own CPU "
          f"{own:.2f} s, the cgroup's {total_cgroup:.2f} s)")  # fmt: skip
    # Held to the quota, and not below a fifth of a core: the Sentry's work is counted here
    # (escaped, the cgroup would show only runsc's own few milliseconds).
    assert 0.2 <= rate <= 1.10 * 0.5, rate
    # gVisor's clock counts a throttled thread as running (it cannot see the host throttle
    # it), so its own figure exceeds the cgroup's, as a guest's does: the mode's floor.
    assert total_cgroup >= GvisorMode.reported_cpu_floor * own > 0, (total_cgroup, own)
    assert affinity == {0}


def test_3gib_allocation_is_oom(tmp_path: Path, work_root: Path) -> None:
    """A 3 GiB allocation in the sandbox under the default 2 GiB quota: the host kills the
    Sentry in the environment's cgroup, resource/oom; nothing is left."""
    require_runsc()
    python = executable(tmp_path / "allocating-python", ALLOCATING_PYTHON)
    spec = spec_for("publish", work_root, campaign="t-gvoom")
    record = run_in_subprocess(spec, {"SANDBENCH_PYTHON": str(python)})
    assert (record.outcome, record.failure_class, record.reason) == ("failed", "resource", "oom")
    assert record.peak_memory_bytes is not None and record.peak_memory_bytes > 1.9 * GIB
    assert leftovers(work_root, "t-gvoom") == NOTHING


def test_limit_kills_the_whole_sandbox(tmp_path: Path, work_root: Path) -> None:
    """At the limit the cgroup kill ends runsc, the gofer and the Sentry; no process, cgroup,
    mount or file of the environment is left."""
    require_runsc()
    python = holding_python(tmp_path)
    hold(work_root, 1000)
    spec = spec_for("publish", work_root, campaign="t-gvlimit", limit_s=5.0)
    record = run_in_subprocess(spec, {"SANDBENCH_PYTHON": str(python)})
    assert (record.outcome, record.reason) == ("failed", "timeout"), record.detail
    assert record.detail and record.detail.startswith("limit of 5 s reached before Ready")
    assert leftovers(work_root, "t-gvlimit") == NOTHING


def test_host_clean_reaps_a_killed_gvisor_environment(tmp_path: Path, work_root: Path) -> None:
    """A runner killed with -9 while its sandbox runs leaves runsc, gofer and Sentry in the
    cgroup and the environment's files; ``sandbench host clean`` removes them all."""
    require_runsc()
    python = holding_python(tmp_path)
    hold(work_root, 1000)
    home = tmp_path / "home"
    home.mkdir()
    spec = spec_for("publish", work_root, campaign="t-gvkill")
    env = {"SANDBENCH_PYTHON": str(python), "SANDBENCH_HOME": str(home)}
    left = reap_killed_runner(spec, env, 3)  # runsc, gofer, Sentry
    assert left["processes"] and left["cgroups"] and left["files"], left
    assert leftovers(work_root, "t-gvkill") == NOTHING


def test_missing_binary_fails_preflight_with_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without runsc on PATH preflight fails naming ``apt-get install runsc``."""
    monkeypatch.setenv("PATH", str(tmp_path))
    verdict = GvisorMode().preflight(HostInfo())
    assert not verdict.ok and "apt-get install runsc" in verdict.reason


def test_a_platform_this_runsc_lacks_fails_preflight() -> None:
    """systrap on a runsc without it (Debian 12's 20221219) is preflight failed naming what it
    offers; an unknown platform or option is refused when the mode is built."""
    runsc = require_runsc()
    offered = offered_platforms(runsc)
    assert "ptrace" in offered, offered
    if "systrap" not in offered:
        verdict = GvisorMode("systrap").preflight(HostInfo())
        assert not verdict.ok and "platform systrap unavailable" in verdict.reason
        assert ", ".join(offered) in verdict.reason
    with pytest.raises(Exception, match="not one of ptrace, systrap, kvm"):
        GvisorMode.from_options({"platform": "ptrce"})
    with pytest.raises(Exception, match="unknown option"):
        GvisorMode.from_options({"platfrom": "ptrace"})


def test_kvm_platform_where_kvm_does_not_work_fails_preflight() -> None:
    """The kvm platform without a working /dev/kvm (absent here in a container, or a nested
    KVM whose guests hang, as on this Firecracker guest) is preflight failed with the reason,
    within the probe's bound; where KVM works it passes."""
    require_runsc()
    started = time.monotonic()
    verdict = GvisorMode("kvm").preflight(HostInfo())
    print(f"gvisor kvm preflight: ok={verdict.ok} {verdict.reason}")
    assert time.monotonic() - started < 40
    if not verdict.ok:
        assert "/dev/kvm" in verdict.reason or "kvm platform" in verdict.reason, verdict.reason
    assert not any(
        "sandbench-gvisor-" in " ".join(p.info["cmdline"] or [])
        for p in psutil.process_iter(["cmdline"])
    )


def test_report_names_runsc_version_platform_and_flags_next_to_the_mode(tmp_path: Path) -> None:
    """A campaign's report names, next to the gvisor mode, the runsc version, the platform and
    the flags it ran with (the host's provenance)."""
    require_runsc()
    plan = tmp_path / "plan.toml"
    plan.write_text('name = "gv"\nmodes = ["gvisor"]\nworkloads = ["publish"]\nenvironments = 1\n'
                    "scale = 0.02\nsentinel = false\n")  # fmt: skip
    data, home = tmp_path / "data", tmp_path / "home"
    argv = [sys.executable, "-m", "coordinator", "run", str(plan), "--data", str(data),
            "--work-root", str(tmp_path / "work"), "--key", str(home / "host.key"),
            "--registry", str(home / "hosts.json"), "--no-progress"]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    campaign = done.stdout.strip().splitlines()[-1].removeprefix("campaign: ")
    report = (data / campaign / "report.md").read_text()
    (line,) = [ln for ln in report.splitlines() if ln.startswith("| gvisor | runsc")]
    assert "runsc version 0" in line and "platform ptrace" in line, line
    assert "--ignore-cgroups" in line and "--overlay2=none" in line, line
