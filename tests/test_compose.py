"""The compose fleet for real: docker-compose.yml built and run on a private dockerd, no registry.

The base image comes from Debian's archive (ops/base-image.sh). The daemon's state directory
persists between runs on one machine (``$SANDBENCH_COMPOSE_DOCKER_DIR``), so the base image and
the build's layers are reused there; a fresh machine builds everything.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from coordinator.store.store import Store
from tests.conftest import REPO, require, require_binary
from tests.fleet_helpers import free_port, wait_until, write_plan
from tests.flower_view import ACTIONS, FlowerView
from worker.dockerd import Dockerd

pytestmark = pytest.mark.compose

DOCKER_DIR = Path(os.environ.get("SANDBENCH_COMPOSE_DOCKER_DIR", "/var/tmp/sandbench-compose"))
BASE_IMAGE = "sandbench-base:bookworm"
HOSTS = ("lab-a", "lab-b")
# Modes that truly run inside a worker container: the payload directly, bubblewrap, overlayfs
# on the work-root volume. (docker, podman and the VM modes would need their runtimes inside.)
MODES = ["native", "host", "staged"]
BUILD_TIMEOUT_S = 1800  # a fresh machine: base image, apt-get and pip in the build
STEP_TIMEOUT_S = 300
DATA = "/var/lib/sandbench/data"
FLOWER_USER = "watcher"
PAGE_ROWS = 15  # Flower's task table shows 15 rows a page
ENVIRONMENT_ROW = re.compile(r">(lab-[ab]) (native|host|staged)/(?:publish|seq-write) #\d<")


class Compose:
    """One docker-compose project of this repository on a private daemon."""

    def __init__(self, daemon: Dockerd, project: str, env: dict[str, str]) -> None:
        self.daemon, self.project, self.env = daemon, project, env
        self.compose = require_binary("docker-compose")

    def run(self, *args: str, stdin: str | None = None, timeout: float = STEP_TIMEOUT_S,
            check: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """``docker-compose -p PROJECT ARGS`` in the repository."""
        argv = [self.compose, "-f", str(REPO / "docker-compose.yml"), "-p", self.project, *args]
        done = subprocess.run(argv, cwd=REPO, env=self.env, input=stdin, text=True,
                              capture_output=True, timeout=timeout)  # fmt: skip
        if check:
            assert done.returncode == 0, f"{args}: {done.stderr[-3000:]}\n{self.logs()}"
        return done

    def sh(self, service: str, script: str, stdin: str | None = None) -> str:
        """Output of ``sh -c SCRIPT`` inside ``service``."""
        return self.run("exec", "-T", service, "sh", "-c", script, stdin=stdin).stdout

    def sandbench(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``sandbench ARGS`` inside the coordinator container."""
        return self.run("exec", "-T", "coordinator", "sandbench", *args, check=check)

    def container(self, service: str) -> str:
        """The id of ``service``'s container."""
        return self.run("ps", "-q", service).stdout.strip()

    def logs(self, service: str = "") -> str:
        """Recent logs of one service (every service by default)."""
        argv = ["logs", "--no-color", "--tail=60", *([service] if service else [])]
        return self.run(*argv, check=False).stdout

    def labelled(self, kind: str) -> list[str]:
        """Ids of this project's objects of ``kind`` (container, volume, network) left."""
        verb = {"container": ("ps", "-aq"), "volume": ("volume", "ls", "-q"),
                "network": ("network", "ls", "-q")}[kind]  # fmt: skip
        label = f"label=com.docker.compose.project={self.project}"
        return self.daemon.run(*verb, "--filter", label).split()


@pytest.fixture
def compose(tmp_path: Path) -> Iterator[Compose]:
    """This repository's fleet built and up on a private daemon; always taken down after."""
    require(
        shutil.which("mmdebstrap") is not None or shutil.which("debootstrap") is not None,
        "mmdebstrap or debootstrap (installed by ops/setup.sh)",
    )
    require_binary("dockerd")
    daemon = Dockerd(DOCKER_DIR / "docker")
    daemon.ensure()  # stopped by this process's exit unless `sandbench host docker start`ed
    env = {**os.environ, "DOCKER_HOST": daemon.host_url,
           "SANDBENCH_REDIS_PASSWORD": secrets.token_hex(12),
           "SANDBENCH_FLOWER_AUTH": f"{FLOWER_USER}:{secrets.token_hex(12)}",
           "SANDBENCH_BASE_IMAGE": BASE_IMAGE,
           "SANDBENCH_FLOWER_PORT": str(free_port())}  # fmt: skip
    env.pop("COMPOSE_FILE", None)
    base = subprocess.run(["bash", str(REPO / "ops" / "base-image.sh"), "--tag", BASE_IMAGE],
                          env={**env, "DOCKER": daemon.docker}, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S)  # fmt: skip
    assert base.returncode == 0, base.stderr[-3000:]
    fleet = Compose(daemon, f"sbtest{os.getpid()}", env)
    try:
        fleet.run("up", "--build", "-d", timeout=BUILD_TIMEOUT_S)
        yield fleet
    finally:
        fleet.run("down", "-v", "--remove-orphans", check=False)


def test_compose_fleet_runs_a_plan_on_both_workers_and_goes_away(
    compose: Compose, tmp_path: Path
) -> None:
    """Up: keys apart, a plan on both workers verified and read from the host, Flower read-only
    with a screenshot, a changed key refused; down -v: nothing of the fleet left."""
    registered = _registered_public_keys(compose)
    _assert_no_secret_on_a_command_line(compose)
    _assert_keys_apart(compose, registered)
    campaign, data = _run_plan(compose, tmp_path)
    _assert_flower_watches(compose, campaign, data, tmp_path)
    containers = {s: compose.container(s) for s in ("redis", "coordinator", *HOSTS, "flower")}
    _assert_changed_key_refused(compose, registered["lab-a"])
    compose.run("down", "-v")
    _assert_nothing_left(compose, campaign, containers)


def _registered_public_keys(compose: Compose) -> dict[str, str]:
    """Wait until the coordinator trusts both workers; their registered public keys."""

    def registry() -> dict[str, str]:
        done = compose.sandbench("hosts", "list", "--json", check=False)
        if done.returncode != 0:
            return {}
        entries = json.loads(done.stdout)
        return {h: e["public_key"] for h, e in entries.items() if h in HOSTS}

    keys = wait_until(lambda: len(registry()) == len(HOSTS) and registry(), 180,
                      "the coordinator to register lab-a and lab-b")  # fmt: skip
    assert isinstance(keys, dict)
    return keys


def _assert_no_secret_on_a_command_line(compose: Compose) -> None:
    """Neither the Redis nor the Flower password shows in any process's command line."""
    secrets_ = (compose.env["SANDBENCH_REDIS_PASSWORD"],
                compose.env["SANDBENCH_FLOWER_AUTH"].split(":", 1)[1])  # fmt: skip
    assert compose.sh("redis", "redis-cli ping 2>&1").strip() != "PONG"  # a password is needed
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        assert not any(s in line for s in secrets_), (proc.pid, line)


def _assert_keys_apart(compose: Compose, registered: dict[str, str]) -> None:
    """Each private key is on its own worker only; the coordinator holds public keys alone."""
    find = "find / \\( -path /proc -o -path /sys \\) -prune -o -name host.key -print"
    assert compose.sh("coordinator", find).split() == []
    assert compose.sh("flower", find).split() == []
    show = (
        "python -c 'import contract.signing as s; print(s.HostKey.load_or_create().public_b64())'"
    )
    for host in HOSTS:
        assert compose.sh(host, find).split() == ["/var/lib/sandbench/home/host.key"]
        assert compose.sh(host, show).strip() == registered[host]
        exported = compose.sh("coordinator", f"cat /var/lib/sandbench/pubkeys/{host}/*")
        assert exported.strip() == registered[host]


def _run_plan(compose: Compose, tmp_path: Path) -> tuple[str, Path]:
    """Dispatch a small plan through the coordinator container and wait for both hosts;
    the campaign id and its store directory copied to this host."""
    plan = write_plan(tmp_path / "plan.toml", environments=2, rounds=2, modes=MODES,
                      workloads=["publish", "seq-write"], limit_s=60,
                      sentinel=False)  # its own tests: test_sentinel.py  # fmt: skip
    compose.sh("coordinator", "cat > /tmp/plan.toml", stdin=plan.read_text())
    out = compose.sandbench("dispatch", "/tmp/plan.toml", "--hosts", ",".join(HOSTS),
                            "--data", DATA).stdout  # fmt: skip
    campaign = out.strip().splitlines()[-1].removeprefix("campaign: ")

    def finished() -> bool:
        status = compose.sandbench("status", campaign, "--json", "--data", DATA, check=False)
        return status.returncode == 0 and '"finished": true' in status.stdout

    wait_until(finished, STEP_TIMEOUT_S, "both hosts finalized", interval=2)
    verified = compose.sandbench("verify", campaign, "--data", DATA, check=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    local = tmp_path / "data"
    local.mkdir()
    compose.daemon.run("cp", f"{compose.container('coordinator')}:{DATA}/{campaign}", str(local))
    records = Store(local).records(campaign)
    planned = Store(local).load_campaign(campaign).specs
    assert len(records) == len(planned) == len(HOSTS) * len(MODES) * 2 * 2
    assert {(r.host, r.mode, r.outcome) for r in records} == {
        (h, m, "passed") for h in HOSTS for m in MODES
    }, [(r.host, r.mode, r.outcome, r.reason, r.detail) for r in records if r.outcome != "passed"]
    report = (local / campaign / "report.md").read_text()
    assert all(f"## Host {h}" in report for h in HOSTS), report[:2000]
    return campaign, local


def _flower(compose: Compose) -> FlowerView:
    """The view of the fleet's Flower through its published port."""
    user, password = compose.env["SANDBENCH_FLOWER_AUTH"].split(":", 1)
    view = FlowerView(f"http://127.0.0.1:{compose.env['SANDBENCH_FLOWER_PORT']}", user, password)
    wait_until(view.answers, 60, "Flower to answer")
    return view


def _assert_flower_watches(compose: Compose, campaign: str, data: Path, tmp_path: Path) -> None:
    """Flower lists every environment behind auth, refuses every action, and renders its page."""
    view = _flower(compose)
    planned = {s.task_id: s for s in Store(data).load_campaign(campaign).specs}
    seen = wait_until(lambda: planned.keys() <= view.tasks().keys() and view.tasks(), 60,
                      "Flower to list every environment")  # fmt: skip
    assert {seen[t]["args"].split(" #")[0] for t in planned} == {
        f"{h} {m}/{w}" for h in HOSTS for m in MODES for w in ("publish", "seq-write")
    }
    assert view.get("/api/tasks", auth=False)[0] == 401
    worker = next(iter(view.json("/api/workers?refresh=1")))
    for action, (template, body) in ACTIONS.items():
        code, text = view.post(template.format(task="run_environment", task_id=next(iter(planned)),
                                               worker=worker), body)  # fmt: skip
        assert code == 403 and "Read only" in text, (action, code, text)
    assert len(view.tasks()) == len(planned), "a refused action ran a task"
    page = "/tasks?name=run_environment"  # the task page filtered to environments
    shot = view.screenshot(page, tmp_path / "flower-tasks.png")
    dom = view.dom(page, tmp_path)
    (tmp_path / "flower-tasks.html").write_text(dom)
    rows = ENVIRONMENT_ROW.findall(dom)
    assert len(rows) == PAGE_ROWS and {h for h, _ in rows} == set(HOSTS), (rows, shot)


def _assert_changed_key_refused(compose: Compose, old_public: str) -> None:
    """lab-a comes back with a new key: the coordinator refuses it, naming both fingerprints."""
    from contract.signing import fingerprint

    compose.sh("lab-a", "rm /var/lib/sandbench/home/host.key /var/lib/sandbench/home/host.name "
                        "/var/lib/sandbench/home/hosts.json")  # fmt: skip
    compose.run("restart", "lab-a")

    def exported() -> str:
        key = compose.sh("coordinator", "cat /var/lib/sandbench/pubkeys/lab-a/lab-a.pub").strip()
        return key if key != old_public else ""

    new_public = wait_until(exported, 60, "lab-a's new public key")
    compose.run("restart", "coordinator")
    refusal = (
        f"registered fingerprint {fingerprint(old_public)}, presented {fingerprint(new_public)}"
    )
    wait_until(lambda: refusal in compose.logs("coordinator"), 60, "the coordinator's refusal")
    logs = compose.logs("coordinator")
    assert f"sandbench hosts add --replace lab-a {new_public}" in logs, logs


def _assert_nothing_left(compose: Compose, campaign: str, containers: dict[str, str]) -> None:
    """No container, volume or network of the project, no process of its containers, no
    environment cgroup of its campaign, and nothing listening on Flower's port."""
    for kind in ("container", "volume", "network"):
        assert compose.labelled(kind) == [], kind
    ids = set(containers.values())
    for proc in psutil.process_iter(["pid"]):
        try:
            cgroups = Path(f"/proc/{proc.pid}/cgroup").read_text()
        except OSError:
            continue
        assert not any(i in cgroups for i in ids), (proc.pid, proc.cmdline(), cgroups)
    cgroups = Path("/sys/fs/cgroup")  # v1: one tree per controller; v2: one tree
    leftovers = [*cgroups.glob(f"*/sandbench/{campaign}*"), *cgroups.glob(f"sandbench/{campaign}*")]
    assert leftovers == [], leftovers
    assert not _listening(int(compose.env["SANDBENCH_FLOWER_PORT"]))


def _listening(port: int) -> bool:
    """Whether anything accepts connections on 127.0.0.1:``port``."""
    return any(
        c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
        for c in psutil.net_connections("tcp")
    )


def test_readme_shows_the_compose_steps_this_test_runs() -> None:
    """The README's compose block has each step above in the form the test runs it."""
    readme = (REPO / "README.md").read_text().replace("\\\n    ", "")
    block = readme.split("### The fleet in docker-compose", 1)[1].split("```", 2)[1]
    steps = ["export DOCKER_HOST=unix:///var/lib/sandbench/docker/docker.sock",
             "ops/base-image.sh", "SANDBENCH_BASE_IMAGE=sandbench-base:bookworm",
             "docker-compose up --build -d",
             "docker-compose exec -T coordinator sh -c 'cat > /tmp/plan.toml' < plan.toml",
             (f"docker-compose exec -T coordinator sandbench dispatch /tmp/plan.toml --hosts "
             f"{','.join(HOSTS)} --data {DATA}"),
             f'docker cp "$(docker-compose ps -q coordinator)":{DATA}/<id> .',
             "docker-compose down -v"]  # fmt: skip
    assert [s for s in steps if s not in block] == []
    assert Dockerd(Path("/var/lib/sandbench/docker")).host_url in block
