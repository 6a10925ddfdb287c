"""The docker mode on the suite's own private dockerd: workloads, quota, OOM, limit, preflight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from contract.records import EnvironmentSpec, Quota
from tests.conftest import REPO, mode_spec, require_binary
from tests.container_probe import PROBE
from tests.nsjail_probe import launch
from worker import cgroups
from worker.dockerd import DOCKERD_ENV, STATE_DIR_ENV, Dockerd
from worker.modes.base import EnvContext, HostInfo
from worker.modes.container import (
    PAYLOAD_DIR_IN,
    container_name,
    create_argv,
    unmanaged_cgroup_dirs,
)
from worker.modes.docker import DockerMode
from worker.procs import close_pipes
from workloads.catalog import DECLARED
from workloads.drive import PAYLOAD_PYTHON

pytestmark = pytest.mark.docker

WORKLOADS = list(DECLARED)
SCALE = 0.02
MiB = 1024 * 1024


@pytest.fixture(scope="session")
def dockerd() -> Iterator[Dockerd]:
    """The suite's own private dockerd (short state path), stopped and purged after."""
    require_binary("dockerd")
    state = Path(tempfile.mkdtemp(prefix="sbdk-", dir="/tmp"))
    saved = os.environ.get(STATE_DIR_ENV)
    os.environ[STATE_DIR_ENV] = str(state)
    daemon = Dockerd(state_dir=state)
    daemon.start()
    yield daemon
    daemon.purge()
    if saved is None:
        os.environ.pop(STATE_DIR_ENV, None)
    else:
        os.environ[STATE_DIR_ENV] = saved


def spec_for(workload: str, work_root: Path, **overrides: object) -> EnvironmentSpec:
    """A docker-mode environment of ``workload`` at the test scale."""
    return mode_spec("docker", workload, work_root, **overrides)


def assert_no_containers(daemon: Dockerd) -> None:
    """The private daemon lists no container at all."""
    assert daemon.run("ps", "--all", "--quiet").strip() == ""


def test_preflight_names_image_and_tools(dockerd: Dockerd) -> None:
    """Preflight reports the imported image's id, how it was built, and the tools it runs."""
    verdict = DockerMode().preflight(HostInfo())
    assert verdict.ok, verdict.reason
    facts = verdict.facts
    assert facts["image_id"].startswith("sha256:")
    assert "docker import" in facts["image_build"] and "/usr" in facts["image_build"]
    assert facts["daemon_socket"] == str(dockerd.socket)
    host_python = subprocess.run(
        [PAYLOAD_PYTHON, "-I", "-S", "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert facts["tools"]["python3"] == host_python
    assert set(facts["tools"]) == {"python3", "git", "gcc", "make"}


@pytest.mark.parametrize("workload", WORKLOADS)
def test_workload_passes(dockerd: Dockerd, work_root: Path, workload: str) -> None:
    """Every workload passes in docker mode at scale 0.02, oracle included, leaving nothing."""
    from worker.runner import run_environment

    record = run_environment(spec_for(workload, work_root))
    assert record is not None
    assert record.outcome == "passed", (record.reason, record.detail)
    assert record.oracle is not None and record.oracle.ok
    assert record.ready_ms is not None and record.ready_ms > 0
    assert [r.k for r in record.rounds] == [1, 2, 3] and all(r.validated for r in record.rounds)
    assert record.provenance["preflight"]["image_id"].startswith("sha256:")
    assert_no_containers(dockerd)


def _probe_env(tmp_path: Path, quota: Quota) -> tuple[EnvContext, cgroups.Cgroup]:
    """An environment whose payload is the probe, with a real cgroup of ``quota``."""
    probe = tmp_path / "payload" / "probe.py"  # its directory is bound, as the payload's
    probe.parent.mkdir()
    probe.write_text(PROBE)
    (tmp_path / "ws").mkdir()
    (tmp_path / "env").mkdir()
    spec = spec_for("seq-write", tmp_path, quota=quota)
    cgroup = cgroups.create(cgroups.cgroup_name(spec.key()), quota)
    env = EnvContext(spec, tmp_path / "ws", tmp_path / "env", cgroup.path, payload=probe)
    return env, cgroup


def test_container_runs_under_the_quota_and_the_environment_cgroup(
    dockerd: Dockerd, tmp_path: Path
) -> None:
    """Inside, CPUs are 0-1 and the memory limit is the quota; the runner's cgroup accounts it."""
    quota = Quota(cpus="0,1", cpu_quota=1.5, memory_bytes=768 * MiB)
    env, cgroup = _probe_env(tmp_path, quota)
    mode = DockerMode()
    try:
        mode.prepare(env)
        proc = subprocess.Popen(
            mode.launcher(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            preexec_fn=cgroup.preexec(), start_new_session=True,
        )  # fmt: skip
        cgroup.close_preexec()
        out, _ = proc.communicate(b"go\n", timeout=60)
        seen = json.loads(out.decode().splitlines()[1])
        assert proc.returncode == 0
        cpu_s, peak = cgroup.cpu_seconds(), cgroup.peak_memory()
    finally:
        mode.cleanup(env)
        cgroup.remove()
    assert seen["cpus"] == "0-1"
    assert seen["memory"] == quota.memory_bytes and seen["memsw"] == quota.memory_bytes
    assert seen["cfs_quota"] / seen["cfs_period"] == pytest.approx(1.5)
    memory_line = next(line for line in seen["cgroup"].splitlines() if ":memory:" in line)
    assert memory_line.split(":")[2].startswith(env.cgroup_path + "/")
    assert cpu_s >= 0.45, "the environment's cgroup accounts the container's CPU time"
    assert peak is not None and peak > 0
    assert seen["python"] == PAYLOAD_PYTHON and seen["net"] == ["lo"]
    assert all(seen["tools"].values()) and not seen["usr_writable"]
    assert not seen["payload_writable"]
    assert not unmanaged_cgroup_dirs(env.cgroup_path), "runc's extra cgroup dirs are removed"
    assert_no_containers(dockerd)


def test_over_memory_is_recorded_oom(dockerd: Dockerd, work_root: Path) -> None:
    """An environment whose container outgrows its memory quota is recorded as oom."""
    from worker.runner import run_environment

    # the native runner test's limit: cc1 needs more; the container gets all of it, since the
    # environment's cgroup leaves room for the docker client beside the quota
    quota = Quota(memory_bytes=12 * MiB)
    record = run_environment(spec_for("incremental-build", work_root, scale=1.0, quota=quota))
    assert record is not None
    assert (record.outcome, record.failure_class, record.reason) == ("failed", "resource", "oom")
    assert_no_containers(dockerd)


def test_timed_out_container_is_gone(dockerd: Dockerd, work_root: Path) -> None:
    """At the limit the container is killed and removed, and none of its processes survive."""
    from worker.runner import run_environment

    # A twentieth of one CPU stretches each round to about 5 s of wall time (CPU-bound, so
    # never faster): the limit falls after Ready and long before the third round ends.
    quota = Quota(cpus="0", cpu_quota=0.05)
    spec = spec_for("ws256-w1", work_root, scale=1.0, limit_s=5.0, quota=quota, seed=4242)
    record = run_environment(spec)
    assert record is not None
    assert (record.outcome, record.reason) == ("failed", "timeout"), record.detail
    assert record.ready_ms is not None, "the container was running when the limit came"
    assert_no_containers(dockerd)
    # this test's payload, no other
    ours = f"{PAYLOAD_DIR_IN}/payload.py --workload ws256-w1 --seed 4242 "
    leftovers = [
        p.info
        for p in psutil.process_iter(["pid", "cmdline"])
        if ours in " ".join(p.info["cmdline"] or [])
    ]
    assert not leftovers, f"container processes survived: {leftovers}"


def test_cleanup_twice_and_stale_container(dockerd: Dockerd, tmp_path: Path) -> None:
    """prepare replaces a stale container of the same environment; cleanup is idempotent."""
    env, cgroup = _probe_env(tmp_path, Quota())
    mode = DockerMode()
    try:
        mode.prepare(env)
        first = env.state["container_id"]
        mode.prepare(env)
        assert env.state["container_id"] != first
        names = dockerd.run("ps", "--all", "--format", "{{.Names}}").split()
        assert names == [container_name(env)]
    finally:
        mode.cleanup(env)
        mode.cleanup(env)
        cgroup.remove()
    assert_no_containers(dockerd)


def test_api_create_is_the_clients_create(dockerd: Dockerd, tmp_path: Path) -> None:
    """The container ``prepare`` creates through the Engine API is the one ``docker create``
    with the mode's options makes (``container.create_argv``, podman's and the client's form):
    the same config, host config and network as both containers' inspect output shows."""
    env, cgroup = _probe_env(tmp_path, Quota(cpus="0", cpu_quota=0.5, memory_bytes=256 * MiB))
    mode = DockerMode()
    try:
        mode.prepare(env)  # through the API: named container_name(env)
        by_api = dockerd.container(container_name(env))
        argv = create_argv(env, env.state["image_id"])
        argv[argv.index(f"--name={container_name(env)}")] = "--name=sandbench-by-client"
        dockerd.run(*argv)
        by_client = dockerd.container("sandbench-by-client")
    finally:
        dockerd.remove_container("sandbench-by-client")
        mode.cleanup(env)
        cgroup.remove()
    assert by_api is not None and by_client is not None
    for part in ("Config", "HostConfig"):
        a, b = dict(by_api[part]), dict(by_client[part])
        a.pop("Hostname", None), b.pop("Hostname", None)  # generated from the id
        assert a == b, (part, a, b)
    assert by_api["HostConfig"]["NanoCpus"] == 500_000_000  # the quota, not a default
    assert by_api["HostConfig"]["Memory"] == by_api["HostConfig"]["MemorySwap"] == 256 * MiB
    assert by_api["Config"]["OpenStdin"] and by_api["Config"]["StdinOnce"]

    def mounts(found: dict[str, Any]) -> list[dict[str, Any]]:
        return sorted(found["Mounts"], key=lambda m: str(m["Destination"]))  # in no fixed order

    assert mounts(by_api) == mounts(by_client)
    assert set(by_api["NetworkSettings"]["Networks"]) == {"none"}
    assert set(by_client["NetworkSettings"]["Networks"]) == {"none"}
    assert_no_containers(dockerd)


def test_daemon_that_cannot_start_fails_preflight(tmp_path: Path) -> None:
    """A dockerd that dies while starting fails preflight with the daemon's own words."""
    broken = tmp_path / "dockerd"
    broken.write_text("#!/bin/sh\necho 'failed to start daemon: pid file found' >&2\nexit 1\n")
    broken.chmod(0o755)
    daemon = Dockerd(state_dir=tmp_path / "state", dockerd=str(broken))
    verdict = DockerMode(daemon).preflight(HostInfo())
    assert not verdict.ok
    assert "dockerd exited while starting" in verdict.reason and "pid file found" in verdict.reason


def test_missing_dockerd_fails_preflight(tmp_path: Path) -> None:
    """Without dockerd, preflight fails and ``sandbench modes list`` names the reason."""
    missing = str(tmp_path / "no-such-dockerd")
    env = {**os.environ, DOCKERD_ENV: missing, STATE_DIR_ENV: str(tmp_path / "state")}
    verdict = DockerMode(Dockerd(state_dir=tmp_path / "state", dockerd=missing)).preflight(
        HostInfo()
    )
    assert not verdict.ok and f"dockerd not found at {missing}" in verdict.reason
    listed = subprocess.run(
        [sys.executable, "-m", "coordinator", "modes", "list"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    docker_line = next(line for line in listed.stdout.splitlines() if "docker" in line)
    assert f"dockerd not found at {missing}" in docker_line, listed.stdout


# -- docker-gvisor: the same container with runsc as its runtime ---------------------------------


# The payload's stand-in: ready, wait, then the kernel it sees (gVisor's Sentry, not the host's).
GVISOR_PROBE = r"""
import json, sys
print(json.dumps({"op": "ready"}), flush=True)
sys.stdin.readline()
print(open("/proc/version").read().strip(), flush=True)
"""


# Ready, then 3 GiB touched page by page (bytearray zero-fills), past the 2 GiB quota.
ALLOCATING_PROBE = r"""
import json, sys
print(json.dumps({"op": "ready"}), flush=True)
sys.stdin.readline()
b = bytearray(3 << 30)
print("allocated", flush=True)
"""


def gvisor_spec(workload: str, work_root: Path, **overrides: object) -> EnvironmentSpec:
    """A docker-gvisor environment of ``workload`` at the test scale."""
    return spec_for(workload, work_root, mode="docker-gvisor", campaign="t-dgvisor", **overrides)


def test_docker_gvisor_preflight_names_the_runtime(dockerd: Dockerd) -> None:
    """The private daemon has runsc as a runtime; preflight names it and runsc's version."""
    require_binary("runsc")
    from worker.modes.docker_gvisor import DockerGvisorMode

    assert "runsc" in (dockerd.status().get("runtimes") or [])
    verdict = DockerGvisorMode().preflight(HostInfo())
    assert verdict.ok, verdict.reason
    assert verdict.facts["runtime"] == "runsc"
    assert verdict.facts["runsc"].startswith("runsc version ")


@pytest.mark.parametrize("workload", WORKLOADS)
def test_docker_gvisor_workload_passes(dockerd: Dockerd, work_root: Path, workload: str) -> None:
    """Every workload passes in docker-gvisor at scale 0.02, and the container ran on runsc:
    its processes were runsc's (the record's preflight names the runtime), nothing is left."""
    require_binary("runsc")
    from worker.runner import run_environment

    record = run_environment(gvisor_spec(workload, work_root))
    assert record is not None
    assert record.outcome == "passed", (record.reason, record.detail)
    assert record.oracle is not None and record.oracle.ok
    assert record.provenance["preflight"]["runtime"] == "runsc"
    assert "cleanup" not in record.provenance, record.provenance["cleanup"]
    assert_no_containers(dockerd)


def test_docker_gvisor_runs_in_a_sandbox_inside_the_quota(dockerd: Dockerd, tmp_path: Path) -> None:
    """The container's payload runs in gVisor (its kernel says so), and the Sentry and gofer
    run in a cgroup below the environment's, so the quota holds them."""
    require_binary("runsc")
    from worker.modes.docker_gvisor import DockerGvisorMode

    env, cgroup = _probe_env(tmp_path, Quota())
    env.payload.write_text(GVISOR_PROBE)
    mode = DockerGvisorMode()
    try:
        env.state["cgroup"] = cgroup
        proc = launch(env, mode)
        assert proc.stdout is not None and proc.stdin is not None
        proc.stdout.readline()  # the probe's ready line
        sandbox = [p for p in psutil.process_iter(["pid", "cmdline"])
                   if "runsc-sandbox" in " ".join(p.info["cmdline"] or [])
                   and container_name(env) not in " ".join(p.info["cmdline"] or [])]  # fmt: skip
        placed = [cgroup.holds(p.pid) for p in sandbox]
        out, _ = proc.communicate(b"go\n", timeout=60)
        cpu_s = cgroup.cpu_seconds()
    finally:
        mode.cleanup(env)
        cgroup.remove()
    assert sandbox and all(placed), placed
    assert proc.returncode == 0, out
    assert "gVisor" in out.decode() or "4.4.0" in out.decode(), out  # gVisor's own kernel
    assert cpu_s > 0.1, "the environment's cgroup accounts the sandbox's CPU time"
    assert_no_containers(dockerd)


def test_docker_gvisor_over_memory_is_oom(dockerd: Dockerd, tmp_path: Path) -> None:
    """A 3 GiB allocation in the sandbox under the 2 GiB quota: the host kills the Sentry in
    the container's cgroup, and the mode's OOM verdict (read before cleanup) says so."""
    require_binary("runsc")
    from worker.modes.docker_gvisor import DockerGvisorMode

    env, cgroup = _probe_env(tmp_path, Quota())
    env.payload.write_text(ALLOCATING_PROBE)
    mode = DockerGvisorMode()
    try:
        env.state["cgroup"] = cgroup
        proc = launch(env, mode)
        out, _ = proc.communicate(b"go\n", timeout=120)
        killed = mode.oom_killed(env) or cgroup.oom_killed()
        peak = cgroup.peak_memory()
    finally:
        mode.cleanup(env)
        cgroup.remove()
    assert proc.returncode != 0 and b"allocated" not in out, out
    assert killed, "an OOM kill, seen by docker or by the environment's cgroup"
    assert peak is not None and peak > 1.9 * 1024 * MiB
    assert_no_containers(dockerd)


def test_docker_gvisor_without_runsc_fails_preflight(
    dockerd: Dockerd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without runsc on PATH preflight fails naming ``apt-get install runsc``."""
    from worker.modes.docker_gvisor import DockerGvisorMode

    monkeypatch.setenv("PATH", str(tmp_path))
    verdict = DockerGvisorMode().preflight(HostInfo())
    assert not verdict.ok and "apt-get install runsc" in verdict.reason


def test_docker_gvisor_cpu_burner_is_held_to_the_quota(dockerd: Dockerd, tmp_path: Path) -> None:
    """Four busy threads in a docker-gvisor container under half a core on CPU 0: the
    environment's cgroup (the container's below it) gets at most half a core, and at least a
    fifth of one (the Sentry's work is counted there)."""
    require_binary("runsc")
    from tests.nsjail_probe import BURNER
    from worker.modes.docker_gvisor import DockerGvisorMode

    quota = Quota(cpus="0", cpu_quota=0.5)
    env, cgroup = _probe_env(tmp_path, quota)
    env.payload.write_text(BURNER)
    mode = DockerGvisorMode()
    try:
        env.state["cgroup"] = cgroup
        proc = launch(env, mode)
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"op": "ready"}
        time.sleep(1.0)
        wall0, cpu0 = time.monotonic(), cgroup.cpu_seconds()
        time.sleep(4.0)
        rate = (cgroup.cpu_seconds() - cpu0) / (time.monotonic() - wall0)
        proc.kill()
        proc.wait(timeout=30)
        close_pipes(proc)
    finally:
        mode.cleanup(env)
        cgroup.kill()
        cgroup.remove()
    print(f"docker-gvisor CPU burner: {rate:.3f} cores under a 0.5-core quota")
    assert 0.2 <= rate <= 1.10 * 0.5, rate
    assert_no_containers(dockerd)


def test_docker_gvisor_limit_leaves_no_sandbox(dockerd: Dockerd, work_root: Path) -> None:
    """At the limit the container is killed and removed with its Sentry and gofer: no runsc
    process of it survives."""
    require_binary("runsc")
    from worker.runner import run_environment

    quota = Quota(cpus="0", cpu_quota=0.05)  # each round stretches to seconds: the limit falls
    spec = gvisor_spec("ws256-w1", work_root, scale=1.0, limit_s=8.0, quota=quota, seed=4243)
    record = run_environment(spec)
    assert record is not None
    assert (record.outcome, record.reason) == ("failed", "timeout"), record.detail
    assert_no_containers(dockerd)
    sandboxes = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                 if "runsc-sandbox" in " ".join(p.info["cmdline"] or [])]  # fmt: skip
    assert sandboxes == [], sandboxes
