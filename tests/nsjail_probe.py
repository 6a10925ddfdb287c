"""Stand-in payloads and helpers for the nsjail mode's tests, here and inside the v2 host."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from contract.records import EnvironmentRecord, EnvironmentSpec, Quota
from tests.conftest import REPO
from worker import cgroups
from worker.modes.base import EnvContext, Mode
from worker.modes.nsjail import NsjailMode
from worker.procs import close_pipes

MEASURE_S = 4.0

# Runs in the jail in place of the payload: ready, wait, then what the jail looks like inside.
PROBE = r"""
import json, os, resource, socket, sys
root = sys.argv[sys.argv.index("--root") + 1]
print(json.dumps({"op": "ready"}), flush=True)
sys.stdin.readline()
def attempt(path, text="x"):
    try:
        with open(path, "w") as f:
            f.write(text)
        return "ok"
    except OSError as exc:
        return exc.errno
escapes = [p for p in ("/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/memory/cgroup.procs",
                       "/sys/fs/cgroup/cpu/cgroup.procs", "/sys/fs/cgroup/pids/cgroup.procs")
           if os.path.exists(p)]
limits = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC")
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines())
print(json.dumps({
    "pid": os.getpid(), "hostname": socket.gethostname(),
    "net": sorted(name for _, name in socket.if_nameindex()),
    "cgroup": open("/proc/self/cgroup").read(),
    "nice": os.getpriority(os.PRIO_PROCESS, 0), "cap_eff": status["CapEff"].strip(),
    "rlimits": {n: list(resource.getrlimit(getattr(resource, n))) for n in limits},
    "workspace": attempt(os.path.join(root, "inside.txt")),
    "outside": {p: attempt(p) for p in ("/etc/sb-probe", "/tmp/sb-probe", "/var/tmp/sb-probe",
                                          os.path.join(os.path.dirname(sys.argv[0]), "x"))},
    "escapes": {p: attempt(p, str(os.getpid())) for p in escapes},
    "dev_null": attempt("/dev/null"), "dev": sorted(os.listdir("/dev")),
}), flush=True)
"""
# Runs in the sandbox in place of the payload: ready, then four threads that never stop; told to
# stop, the CPU time the process's own kernel counted for it (gVisor's Sentry's, in gvisor).
BURNER = r"""
import hashlib, json, resource, sys, threading
print(json.dumps({"op": "ready"}), flush=True)
def spin():
    while True:
        hashlib.sha256(bytes(1 << 20)).digest()
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
sys.stdin.readline()
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": u.ru_utime + u.ru_stime}), flush=True)
sys.stdin.readline()
"""
# A payload interpreter that first allocates 3 GiB (past the 2 GiB quota), then runs the payload.
ALLOCATING_PYTHON = """#!/bin/sh
case "$3" in --version) exec /usr/bin/python3 "$@";; esac
/usr/bin/python3 -I -S -c 'b = bytearray(3 << 30)'
exec /usr/bin/python3 "$@"
"""
RUN_ONE = """
import sys
from contract.records import EnvironmentSpec
from worker.runner import run_environment
spec = EnvironmentSpec.model_validate_json(sys.argv[1])
print(run_environment(spec).model_dump_json())
"""
KILLED_RUNNER = """
import sys
from contract.records import EnvironmentSpec
from worker.runner import run_environment
run_environment(EnvironmentSpec.model_validate_json(sys.argv[1]))
"""


def launch(env: EnvContext, mode: Mode | None = None) -> subprocess.Popen[bytes]:
    """The launcher of ``mode`` (default nsjail), spawned into the environment's cgroup as the
    runner does (after the mode's preparation)."""
    cgroup: cgroups.Cgroup = env.state["cgroup"]
    mode = mode or NsjailMode()
    mode.prepare(env)
    proc = subprocess.Popen(
        mode.launcher(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, preexec_fn=cgroup.preexec(), start_new_session=True,
        cwd=env.env_dir,
    )  # fmt: skip
    cgroup.close_preexec()
    return proc


def cpu_of(proc: psutil.Process) -> float:
    """User plus system CPU seconds of ``proc`` (all its threads)."""
    times = proc.cpu_times()
    return float(times.user + times.system)


def run_in_subprocess(spec: EnvironmentSpec, env: dict[str, str]) -> EnvironmentRecord:
    """The record of ``spec`` run by a fresh runner process with the environment ``env``."""
    done = subprocess.run(
        [sys.executable, "-c", RUN_ONE, spec.model_dump_json()], cwd=REPO,
        env={**os.environ, **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return EnvironmentRecord.model_validate_json(done.stdout.strip().splitlines()[-1])


def executable(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` as an executable script."""
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@dataclass(frozen=True)
class Burn:
    """What a measured burner did: cores used (cgroup CPU over wall), CPU seconds the cgroup
    and the payload itself counted, and the CPUs the payload may run on."""

    rate: float
    cgroup_cpu_s: float
    own_cpu_s: float
    affinity: set[int]


def measure_burner(env: EnvContext, cgroup: cgroups.Cgroup) -> Burn:
    """Launch ``BURNER`` as ``env``'s payload in the jail and measure it for ``MEASURE_S``."""
    import json

    proc = launch(env)
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"op": "ready"}
        time.sleep(1.0)  # the threads start
        payload = psutil.Process(proc.pid).children()[0]
        wall0, cpu0, own0 = time.monotonic(), cgroup.cpu_seconds(), cpu_of(payload)
        time.sleep(MEASURE_S)
        cpu, own = cgroup.cpu_seconds() - cpu0, cpu_of(payload) - own0
        rate = cpu / (time.monotonic() - wall0)
        affinity = set(payload.cpu_affinity())
    finally:
        proc.kill()
        cgroup.kill()
        proc.wait(timeout=30)
        close_pipes(proc)
    return Burn(rate, cpu, own, affinity)


def reap_killed_runner(
    spec: EnvironmentSpec, env: dict[str, str], processes: int
) -> dict[str, list[str]]:
    """Run ``spec`` in a runner killed with -9 once ``processes`` processes of its environment
    run, then ``sandbench host clean`` its work root; what was left before the clean."""
    from tests.leftovers import leftovers

    work_root = Path(spec.work_root)
    full_env = {**os.environ, **env}
    runner = subprocess.Popen([sys.executable, "-c", KILLED_RUNNER, spec.model_dump_json()],
                              cwd=REPO, env=full_env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(leftovers(work_root, spec.campaign)["processes"]) < processes:
            assert runner.poll() is None and time.monotonic() < deadline, "the sandbox never ran"
            time.sleep(0.1)
    finally:
        runner.kill()
        runner.wait(timeout=30)
    left = leftovers(work_root, spec.campaign)
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", "host", "clean", "--work-root", str(work_root),
         "--json"], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return left


@contextlib.contextmanager
def probe_environment(
    base: Path, spec: EnvironmentSpec, script: str, quota: Quota, mode: Mode | None = None
) -> Iterator[EnvContext]:
    """An environment under ``base`` whose payload is ``script`` (its directory bound as the
    payload's), with a real cgroup of ``quota``; killed, cleaned up (by ``mode``) and removed."""
    payload = base / "payload" / "probe.py"
    payload.parent.mkdir()
    payload.write_text(script)
    for name in ("ws", "env"):
        (base / name).mkdir()
    cgroup = cgroups.create(cgroups.cgroup_name(spec.key()), quota)
    env = EnvContext(spec, base / "ws", base / "env", cgroup.path, payload=payload)
    env.state["cgroup"] = cgroup
    try:
        yield env
    finally:
        cgroup.kill()
        if mode is not None:
            mode.cleanup(env)
        cgroup.remove()
