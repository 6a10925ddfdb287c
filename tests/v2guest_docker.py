"""Inside the cgroup v2 lab host: the docker and docker-gvisor modes (private dockerd) and a small
campaign.

Run by ``tests/test_v2host.py`` in one boot of ``ops/v2-host.sh`` (delegated placement); not
collected on the host (its name is not ``test_*``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.records import EnvironmentRecord, EnvironmentSpec, Quota
from testbed.v2host import SERVICE
from worker import cgroups
from worker.dockerd import Dockerd
from worker.modes.base import EnvContext, HostInfo
from worker.modes.docker import CLIENT_MEMORY_BYTES, DockerMode
from worker.runner import run_environment

ROOT = Path("/sys/fs/cgroup")
SANDBENCH = str(Path(sys.executable).parent / "sandbench")
GIB, MIB = 1 << 30, 1 << 20
QUOTA_FILES = ("cpu.max", "cpuset.cpus.effective", "memory.max", "memory.swap.max")
# Runs in the container in place of the payload: ready, the container's own limits, then 3 GiB.
PROBE = r"""
import json, sys
print(json.dumps({"op": "ready"}), flush=True)
sys.stdin.readline()
def read(name):
    with open("/sys/fs/cgroup/" + name) as f:
        return f.read().strip()
print(json.dumps({n: read(n) for n in QUOTA_FILES}), flush=True)
hog = bytearray(3 << 30)
print(json.dumps({"op": "survived"}), flush=True)
""".replace("QUOTA_FILES", repr(QUOTA_FILES))
PLAN = """
name = "v2host-campaign"
modes = ["native", "host", "staged", "docker"]
workloads = ["publish", "seq-write", "stat-tree"]
environments = 1
rounds = 3
scale = 0.02
sentinel = false
"""
CAMPAIGN_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def dockerd() -> Iterator[Dockerd]:
    """The v2 host's private dockerd (its state on the scratch disk), stopped and purged after."""
    daemon = Dockerd()
    daemon.start()
    yield daemon
    daemon.purge()


def spec(work_root: Path, **fields: object) -> EnvironmentSpec:
    """A docker-mode environment (publish at scale 0.02 unless overridden)."""
    values: dict[str, object] = {
        "campaign": "v2docker",
        "host": "v2host",
        "mode": "docker",
        "workload": "publish",
        "env_index": 0,
        "scale": 0.02,
        "work_root": str(work_root),
    }
    values.update(fields)
    return EnvironmentSpec(**values)  # type: ignore[arg-type]


def run(spec_: EnvironmentSpec) -> EnvironmentRecord:
    """The record of one environment."""
    record = run_environment(spec_)
    assert record is not None
    return record


def test_private_dockerd_uses_cgroupfs_on_v2(dockerd: Dockerd) -> None:
    """The private dockerd runs on cgroup v2 with the cgroupfs driver; docker's preflight passes."""
    verdict = DockerMode(dockerd).preflight(HostInfo())
    assert verdict.ok, verdict.reason
    assert verdict.facts["cgroup_driver"] == "cgroupfs"
    assert dockerd.status()["cgroup_version"] == "2"


def test_container_limits_equal_the_quota_and_docker_says_oom(
    dockerd: Dockerd, tmp_path: Path
) -> None:
    """In the container cpu.max, cpuset, memory.max and memory.swap.max are the quota, its cgroup is
    below the environment's, and its 3 GiB allocation is an OOM kill by docker's own verdict."""
    probe = tmp_path / "payload" / "probe.py"
    probe.parent.mkdir()
    probe.write_text(PROBE)
    for name in ("ws", "env"):
        (tmp_path / name).mkdir()
    quota = Quota()
    env_spec = spec(tmp_path)
    room = quota.model_copy(update={"memory_bytes": quota.memory_bytes + CLIENT_MEMORY_BYTES})
    cgroup = cgroups.create(cgroups.cgroup_name(env_spec.key()), room)  # as the runner does
    env = EnvContext(env_spec, tmp_path / "ws", tmp_path / "env", cgroup.path, payload=probe)
    mode = DockerMode(dockerd)
    try:
        mode.prepare(env)
        with subprocess.Popen(
            mode.launcher(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            preexec_fn=cgroup.preexec(), start_new_session=True,
        ) as proc:  # fmt: skip
            cgroup.close_preexec()
            assert proc.stdin is not None and proc.stdout is not None
            assert json.loads(proc.stdout.readline()) == {"op": "ready"}
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            seen = json.loads(proc.stdout.readline())
            below = {p.name for p in (ROOT / cgroup.path.strip("/")).iterdir() if p.is_dir()}
            rest = proc.stdout.read()
            status = proc.wait(timeout=120)
        docker_verdict, cgroup_saw = mode.oom_killed(env), cgroup.oom_killed()
    finally:
        mode.cleanup(env)
        cgroup.remove()
    assert cgroup.path.startswith(f"{SERVICE}/envs/")
    assert seen == {"cpu.max": "200000 100000", "cpuset.cpus.effective": "0-1",
                    "memory.max": str(2 * GIB), "memory.swap.max": "0"}  # fmt: skip
    assert env.state["container_id"] in below and "launcher" in below
    assert b"survived" not in rest and status == 137
    assert docker_verdict is True and cgroup_saw is True


def test_docker_environment_over_memory_is_oom(dockerd: Dockerd, modes_root: Path) -> None:
    """A docker-mode environment whose build outgrows a 12 MiB quota is recorded as resource/oom."""
    record = run(spec(modes_root, workload="incremental-build", quota=Quota(memory_bytes=12 * MIB)))
    assert (record.outcome, record.failure_class, record.reason) == ("failed", "resource", "oom")
    assert dockerd.run("ps", "--all", "--quiet").strip() == ""


def test_small_campaign_completes_and_verifies(dockerd: Dockerd, tmp_path: Path) -> None:
    """sandbench run of native, host, staged and docker (cgroupfs driver) on three workloads at
    scale 0.02 passes every environment on v2 in delegated cgroups; sandbench verify accepts it."""
    plan, data = tmp_path / "plan.toml", tmp_path / "data"
    plan.write_text(PLAN)
    proc = subprocess.run(
        [SANDBENCH, "run", str(plan), "--data", str(data), "--work-root", str(tmp_path / "work"),
         "--no-progress"],
        capture_output=True, text=True, timeout=CAMPAIGN_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    campaign = proc.stdout.strip().splitlines()[-1].removeprefix("campaign: ")
    (records_file,) = (data / campaign / "hosts").glob("*/records.jsonl")
    records = [json.loads(line) for line in records_file.read_text().splitlines()]
    cells = {(r["mode"], r["workload"]) for r in records}
    assert len(cells) == 12 and all(r["outcome"] == "passed" for r in records), [
        (r["mode"], r["workload"], r["reason"], r["detail"]) for r in records
    ]
    assert all(r["provenance"]["cgroup_version"] == 2 for r in records)
    for record in records:  # each in its own cgroup of the delegated service's envs/
        facts = record["provenance"]["cgroup"]
        assert facts["placement"] == "delegated" and facts["path"].startswith(f"{SERVICE}/envs/")
    docker = [r for r in records if r["mode"] == "docker"]
    assert {r["provenance"]["preflight"]["cgroup_driver"] for r in docker} == {"cgroupfs"}
    assert dockerd.run("ps", "--all", "--quiet").strip() == ""
    provenance = json.loads((records_file.parent / "provenance.json").read_text())
    assert provenance["cgroup"] == "v2"
    verify = subprocess.run(
        [SANDBENCH, "verify", campaign, "--data", str(data)],
        capture_output=True, text=True, timeout=CAMPAIGN_TIMEOUT_S,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]


def test_docker_gvisor_passes_and_its_oom_is_seen(dockerd: Dockerd, tmp_path: Path) -> None:
    """docker-gvisor on v2: a workload passes with runsc as the runtime; a 3 GiB allocation in
    the sandbox is killed under the 2 GiB quota, seen by docker or the environment's cgroup."""
    from tests.test_docker_mode import ALLOCATING_PROBE
    from worker.modes.docker_gvisor import DockerGvisorMode

    work = tmp_path / "work"
    work.mkdir()
    record = run(spec(work, mode="docker-gvisor", campaign="v2dgvisor"))
    assert record.outcome == "passed", (record.reason, record.detail)
    assert record.provenance["preflight"]["runtime"] == "runsc"
    probe = tmp_path / "payload" / "probe.py"
    probe.parent.mkdir()
    probe.write_text(ALLOCATING_PROBE)
    for name in ("ws", "env"):
        (tmp_path / name).mkdir()
    quota = Quota()
    env_spec = spec(tmp_path, mode="docker-gvisor")
    room = quota.model_copy(update={"memory_bytes": quota.memory_bytes + CLIENT_MEMORY_BYTES})
    cgroup = cgroups.create(cgroups.cgroup_name(env_spec.key()), room)
    env = EnvContext(env_spec, tmp_path / "ws", tmp_path / "env", cgroup.path, payload=probe)
    mode = DockerGvisorMode(dockerd)
    try:
        mode.prepare(env)
        proc = subprocess.run(
            mode.launcher(env), input=b"go\n", capture_output=True, timeout=300,
            preexec_fn=cgroup.preexec(), start_new_session=True,
        )  # fmt: skip
        cgroup.close_preexec()
        killed = mode.oom_killed(env) or cgroup.oom_killed()
    finally:
        mode.cleanup(env)
        cgroup.remove()
    assert proc.returncode != 0 and b"allocated" not in proc.stdout, proc.stdout
    assert killed
    assert dockerd.run("ps", "--all", "--quiet").strip() == ""
