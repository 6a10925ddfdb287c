"""The podman mode on the suite's own private store: workloads, quota, OOM, limit, cleanup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from contract.records import EnvironmentSpec, Quota
from tests.conftest import REPO, mode_spec, require_binary
from tests.container_probe import HOG, PROBE
from worker import cgroups
from worker.modes.base import EnvContext, HostInfo
from worker.modes.container import PAYLOAD_DIR_IN
from worker.modes.podman import (
    CONMON_PIDFILE,
    PodmanMode,
    container_name,
    leftover_cgroup_dirs,
)
from worker.podman import PODMAN_ENV, STATE_DIR_ENV, Podman
from workloads.catalog import DECLARED
from workloads.drive import PAYLOAD_PYTHON

pytestmark = pytest.mark.podman

WORKLOADS = list(DECLARED)
SCALE = 0.02
MiB = 1024 * 1024


@pytest.fixture(scope="session")
def store() -> Iterator[Podman]:
    """The suite's own private podman store (short state path), purged after."""
    for binary in ("podman", "conmon", "runc"):
        require_binary(binary)
    state = Path(tempfile.mkdtemp(prefix="sbpm-", dir="/tmp"))
    saved = os.environ.get(STATE_DIR_ENV)
    os.environ[STATE_DIR_ENV] = str(state)
    podman = Podman(state_dir=state)
    podman.setup()
    yield podman
    podman.purge()
    if saved is None:
        os.environ.pop(STATE_DIR_ENV, None)
    else:
        os.environ[STATE_DIR_ENV] = saved


def spec_for(workload: str, work_root: Path, **overrides: object) -> EnvironmentSpec:
    """A podman-mode environment of ``workload`` at the test scale."""
    return mode_spec("podman", workload, work_root, **overrides)


def conmons(store: Podman) -> list[int]:
    """Live conmon processes that serve this store's containers."""
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        alive = proc.info["status"] != psutil.STATUS_ZOMBIE
        if proc.info["name"] == "conmon" and str(store.state_dir) in cmdline and alive:
            found.append(proc.info["pid"])
    return found


def layers(store: Podman) -> set[str]:
    """The overlay layers of the store (the image's, plus any container's)."""
    return {p.name for p in (store.state_dir / "root" / "overlay").iterdir() if p.name != "l"}


def assert_nothing_left(store: Podman, image_layers: set[str]) -> None:
    """No container, conmon, mount or container layer of the store is left."""
    assert store.containers() == []
    assert conmons(store) == []
    assert store.mounts() == []
    assert layers(store) == image_layers
    userdata = store.state_dir / "root" / "overlay-containers"
    assert [p.name for p in userdata.iterdir() if p.is_dir()] == []


@pytest.fixture(scope="session")
def image_layers(store: Podman) -> set[str]:
    """The store's layers once preflight imported the image: all that may stay."""
    verdict = PodmanMode(store).preflight(HostInfo())
    assert verdict.ok, verdict.reason
    return layers(store)


def test_preflight_names_image_runtime_and_tools(store: Podman, image_layers: set[str]) -> None:
    """Preflight reports the imported image, the chosen OCI runtime and the tools it runs."""
    verdict = PodmanMode(store).preflight(HostInfo())
    assert verdict.ok, verdict.reason
    facts = verdict.facts
    assert len(facts["image_id"]) == 64 and "podman import" in facts["image_build"]
    assert facts["podman_version"] and facts["conmon_version"].startswith("conmon version")
    hybrid = not Path("/sys/fs/cgroup/cgroup.controllers").exists()
    assert (facts["runtime_choice"].split(":")[0] == "runc") if hybrid else facts["runtime"]
    assert facts["runtime_version"].startswith(Path(facts["runtime"]).name)
    assert facts["state_dir"] == str(store.state_dir)
    host_python = subprocess.run(
        [PAYLOAD_PYTHON, "-I", "-S", "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert facts["tools"]["python3"] == host_python
    assert set(facts["tools"]) == {"python3", "git", "gcc", "make"}
    assert store.containers() == [] and layers(store) == image_layers


@pytest.mark.parametrize("workload", WORKLOADS)
def test_workload_passes(
    store: Podman, image_layers: set[str], modes_root: Path, workload: str
) -> None:
    """Every workload passes in podman mode at scale 0.02, oracle included, leaving nothing."""
    from worker.runner import run_environment

    record = run_environment(spec_for(workload, modes_root))
    assert record is not None
    assert record.outcome == "passed", (record.reason, record.detail)
    assert record.oracle is not None and record.oracle.ok
    assert record.ready_ms is not None and record.ready_ms > 0
    assert [r.k for r in record.rounds] == [1, 2, 3] and all(r.validated for r in record.rounds)
    assert record.provenance["preflight"]["runtime"]
    assert "cleanup" not in record.provenance, record.provenance["cleanup"]
    assert_nothing_left(store, image_layers)


def _probe_env(tmp_path: Path, quota: Quota, script: str) -> tuple[EnvContext, cgroups.Cgroup]:
    """An environment whose payload is ``script``, with a real cgroup of ``quota``."""
    probe = tmp_path / "payload" / "probe.py"  # its directory is bound, as the payload's
    probe.parent.mkdir()
    probe.write_text(script)
    (tmp_path / "ws").mkdir()
    (tmp_path / "env").mkdir()
    spec = spec_for("seq-write", tmp_path, quota=quota)
    cgroup = cgroups.create(cgroups.cgroup_name(spec.key()), quota)
    env = EnvContext(spec, tmp_path / "ws", tmp_path / "env", cgroup.path, payload=probe)
    return env, cgroup


def _launch(mode: PodmanMode, env: EnvContext, cgroup: cgroups.Cgroup) -> subprocess.Popen[bytes]:
    """The mode's launcher, spawned into the environment's cgroup as the runner does."""
    proc = subprocess.Popen(
        mode.launcher(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        preexec_fn=cgroup.preexec(), start_new_session=True, cwd=env.env_dir,
    )  # fmt: skip
    cgroup.close_preexec()
    return proc


def test_container_runs_under_the_quota_and_the_environment_cgroup(
    store: Podman, image_layers: set[str], tmp_path: Path
) -> None:
    """Inside, CPUs are 0-1 and the memory limit is the quota; the environment's cgroup holds
    the container, the launcher and conmon, and accounts them; labels and pid files are set."""
    quota = Quota(cpus="0,1", cpu_quota=1.5, memory_bytes=768 * MiB)
    env, cgroup = _probe_env(tmp_path, quota, PROBE)
    mode = PodmanMode(store)
    try:
        mode.prepare(env)
        proc = _launch(mode, env, cgroup)
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"op": "ready"}
        in_env_cgroup = {psutil.Process(pid).name() for pid in cgroup.pids()}
        conmon_pid = int((env.env_dir / CONMON_PIDFILE).read_text())
        out, _ = proc.communicate(b"go\n", timeout=60)
        seen = json.loads(out.decode().splitlines()[0])
        assert proc.returncode == 0
        cpu_s, peak = cgroup.cpu_seconds(), cgroup.peak_memory()
        labels = json.loads(
            store.run("inspect", "--format", "{{json .Config.Labels}}", env.state["container"])
        )
    finally:
        mode.cleanup(env)
        cgroup.remove()
    assert seen["cpus"] == "0-1"
    assert seen["memory"] == quota.memory_bytes and seen["memsw"] == quota.memory_bytes
    assert seen["cfs_quota"] / seen["cfs_period"] == pytest.approx(1.5)
    memory_line = next(line for line in seen["cgroup"].splitlines() if ":memory:" in line)
    assert memory_line.split(":")[2].startswith(env.cgroup_path + "/")
    assert {"podman", "conmon"} <= in_env_cgroup and conmon_pid > 0
    assert cpu_s >= 0.45, "the environment's cgroup accounts the container's CPU time"
    assert peak is not None and peak > 0
    assert seen["python"] == PAYLOAD_PYTHON and seen["net"] == ["lo"]
    assert all(seen["tools"].values()) and not seen["usr_writable"]
    assert not seen["payload_writable"]
    assert labels["sandbench"] == "1" and labels["sandbench.env"] == env.spec.key()
    assert not leftover_cgroup_dirs(env.cgroup_path), "the runtime's cgroup dirs are removed"
    assert_nothing_left(store, image_layers)


def test_oom_verdict_is_the_kernels_and_podmans(
    store: Podman, image_layers: set[str], tmp_path: Path
) -> None:
    """A container past its memory limit is OOM-killed by its own cgroup: the kernel's log says
    so (the mode's verdict, without a ``podman inspect``), podman's own flag (what the mode asks
    where the log cannot be read) too, the environment's cgroup (v1: kills count only in the
    victim's cgroup) does not."""
    from worker.cgroups.base import oom_kill_logged

    env, cgroup = _probe_env(tmp_path, Quota(memory_bytes=64 * MiB), HOG)
    mode = PodmanMode(store)
    try:
        mode.prepare(env)
        proc = _launch(mode, env, cgroup)
        out, _ = proc.communicate(b"go\n", timeout=60)
        verdict = mode.oom_killed(env)
        flag = store.run("inspect", "--format", "{{.State.OOMKilled}}", container_name(env))
        environment_saw = cgroup.oom_killed()
    finally:
        mode.cleanup(env)
        cgroup.remove()
    assert b"survived" not in out and proc.returncode == 137
    assert verdict is True and oom_kill_logged(env.cgroup_path) is True
    assert flag.strip() == "true"
    if cgroup.version == 1:
        assert environment_saw is False, "only podman's verdict can classify this OOM"
    assert_nothing_left(store, image_layers)


def test_over_memory_is_recorded_oom(
    store: Podman, image_layers: set[str], work_root: Path
) -> None:
    """An environment whose container outgrows its memory quota is recorded as oom."""
    from worker.cgroups.base import oom_kill_logged
    from worker.runner import run_environment

    # the native runner test's limit: cc1 needs more; the container gets all of it, since the
    # environment's cgroup leaves room for podman and conmon beside the quota
    quota = Quota(memory_bytes=12 * MiB)
    record = run_environment(spec_for("incremental-build", work_root, scale=1.0, quota=quota))
    assert record is not None
    # cc1, a child of the payload, is the one killed: podman's flag (its first process) says
    # nothing; the kernel's log names the container's memory cgroup below the environment's
    assert (record.outcome, record.failure_class, record.reason) == ("failed", "resource", "oom")
    cgroup = record.provenance["cgroup"]["path"]
    assert oom_kill_logged(cgroup) and not oom_kill_logged(cgroup + "-another")
    assert_nothing_left(store, image_layers)


def test_timed_out_container_is_gone(
    store: Podman, image_layers: set[str], work_root: Path
) -> None:
    """At the limit the container is killed and removed, and none of its processes survive."""
    from worker.runner import run_environment

    # A twentieth of one CPU stretches each round to about 5 s of wall time (CPU-bound, so
    # never faster): the limit falls after Ready and long before the third round ends. (At 5 s
    # the limit came before Ready once, on a slow machine, 2026-12-07: the payload's start at a
    # twentieth of a CPU is seconds too.)
    quota = Quota(cpus="0", cpu_quota=0.05)
    spec = spec_for("ws256-w1", work_root, scale=1.0, limit_s=9.0, quota=quota, seed=4243)
    record = run_environment(spec)
    assert record is not None
    assert (record.outcome, record.reason) == ("failed", "timeout"), record.detail
    assert record.ready_ms is not None, "the container was running when the limit came"
    # this test's payload, no other
    ours = f"{PAYLOAD_DIR_IN}/payload.py --workload ws256-w1 --seed 4243 "
    leftovers = [
        p.info
        for p in psutil.process_iter(["pid", "cmdline"])
        if ours in " ".join(p.info["cmdline"] or [])
    ]
    assert not leftovers, f"container processes survived: {leftovers}"
    assert_nothing_left(store, image_layers)


def test_cleanup_twice_and_stale_container(
    store: Podman, image_layers: set[str], tmp_path: Path
) -> None:
    """prepare replaces a stale container of the same environment; cleanup is idempotent. The
    bundle directory prepare computes is the one podman names (its ``StaticDir``)."""
    env, cgroup = _probe_env(tmp_path, Quota(), PROBE)
    mode = PodmanMode(store)
    try:
        mode.prepare(env)
        first = env.state["container_id"]
        named = store.run("inspect", "--format", "{{.StaticDir}}", container_name(env)).strip()
        assert env.state["bundle"] == named
        assert store.static_dir(first) == Path(named)
        assert store.static_dir("0" * 64) is None  # no such container: inspect decides
        mode.prepare(env)
        assert env.state["container_id"] != first
        assert store.containers() == [container_name(env)]
    finally:
        mode.cleanup(env)
        mode.cleanup(env)
        cgroup.remove()
    assert_nothing_left(store, image_layers)


def test_missing_podman_fails_preflight(tmp_path: Path) -> None:
    """Without podman, preflight fails and ``sandbench modes list`` names the reason."""
    missing = str(tmp_path / "no-such-podman")
    env = {**os.environ, PODMAN_ENV: missing, STATE_DIR_ENV: str(tmp_path / "state")}
    verdict = PodmanMode(Podman(state_dir=tmp_path / "state", podman=missing)).preflight(HostInfo())
    assert not verdict.ok and f"podman not found at {missing}" in verdict.reason
    listed = subprocess.run(
        [sys.executable, "-m", "coordinator", "modes", "list"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    podman_line = next(line for line in listed.stdout.splitlines() if "podman" in line)
    assert f"podman not found at {missing}" in podman_line, listed.stdout


KILLED_RUNNER = """
import sys
from contract.records import EnvironmentSpec, Quota
from worker.runner import run_environment

# a twentieth of one CPU: each round of ws256-w1 takes about 5 s, so it is killed mid-round
spec = EnvironmentSpec(
    campaign="t-podkill", host="local", mode="podman", workload="ws256-w1", env_index=0,
    seed=4244, scale=1.0, rounds=3, limit_s=120.0, work_root=sys.argv[1],
    quota=Quota(cpus="0", cpu_quota=0.05),
)
run_environment(spec)
"""


def test_host_clean_reaps_a_killed_podman_environment(
    store: Podman, image_layers: set[str], tmp_path: Path
) -> None:
    """A runner killed with -9 while its podman container runs leaves the container, its
    workspace, cgroup and ledger entry; ``sandbench host clean`` removes them all (container,
    conmon, mounts, container layer) and leaves an unlabelled container of the same store."""
    from tests.leftovers import NOTHING, leftovers
    from worker.modes.podman import ensure_image

    work = tmp_path / "work"
    work.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "SANDBENCH_HOME": str(home), STATE_DIR_ENV: str(store.state_dir)}
    image = ensure_image(store)["image"]
    store.run("create", "--name", "sb-bystander", "--network=none", image, "/bin/true")
    errors = tmp_path / "runner.stderr"
    with errors.open("wb") as stderr:
        runner = subprocess.Popen(
            [sys.executable, "-c", KILLED_RUNNER, str(work)], cwd=REPO, env=env,
            stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (len(store.containers()) == 2 and conmons(store)):  # ours started
            assert runner.poll() is None, errors.read_text()
            assert time.monotonic() < deadline, "the podman environment never started"
            time.sleep(0.2)
        time.sleep(2)  # well inside round 1
        runner.kill()
        runner.wait(timeout=30)
        left = leftovers(work, "t-podkill")
        assert left["files"] and left["cgroups"], left
        assert len(store.containers()) == 2, "the killed runner's container is gone by itself"
        done = subprocess.run(
            [sys.executable, "-m", "coordinator", "host", "clean", "--work-root", str(work),
             "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        result = json.loads(done.stdout.strip().splitlines()[-1])
        kinds = [item["kind"] for item in result["reaped"]]
        assert kinds.count("podman-container") == 1, result
        assert "workspace" in kinds and not result["problems"], result
        assert store.containers() == ["sb-bystander"]
        assert leftovers(work, "t-podkill") == NOTHING
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        store.run("rm", "--force", "sb-bystander")
    assert_nothing_left(store, image_layers)
