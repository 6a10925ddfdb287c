"""The private dockerd: start, status, stop, on-demand ownership and reasoned failures."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO, require_binary
from worker.dockerd import DOCKERD_ENV, STATE_DIR_ENV, Dockerd, DockerdError

pytestmark = pytest.mark.docker
SLEEPER = ["/bin/sleep", "300"]


def _processes_of(state_dir: Path) -> list[psutil.Process]:
    """Processes whose command line names ``state_dir`` (dockerd, containerd, shims)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(state_dir) in arg for arg in proc.info["cmdline"] or []):
            found.append(proc)
    return found


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A short private state directory (unix socket paths are limited to 108 bytes)."""
    require_binary("dockerd")
    path = Path(tempfile.mkdtemp(prefix="sbdk-", dir="/tmp"))
    yield path
    Dockerd(state_dir=path).purge()
    assert not path.exists()


def test_start_status_stop(state_dir: Path) -> None:
    """A daemon starts on its own socket and data root, reports its drivers, and stops fully."""
    daemon = Dockerd(state_dir=state_dir)
    assert daemon.start() is True
    assert daemon.start() is False  # idempotent: already running
    facts = daemon.status()
    assert facts["running"] and facts["socket"] == str(state_dir / "docker.sock")
    assert facts["cgroup_driver"] == "cgroupfs"
    assert (state_dir / "data").is_dir() and (state_dir / "exec").is_dir()
    assert _processes_of(state_dir), "dockerd and its containerd run from the state directory"
    assert daemon.stop() is True
    assert daemon.status()["running"] is False
    assert not _processes_of(state_dir), "stop leaves no dockerd, containerd or shim behind"
    assert daemon.stop() is False


def test_stop_removes_containers(state_dir: Path) -> None:
    """Stopping removes every container, even a running one, and its processes."""
    daemon = Dockerd(state_dir=state_dir)
    daemon.start()
    from worker.modes.container import toolset_mounts
    from worker.modes.docker import ensure_image

    image = ensure_image(daemon)["image"]
    daemon.run("run", "-d", "--network=none", *toolset_mounts(), image, *SLEEPER)
    assert daemon.run("ps", "-q").strip()
    daemon.stop()
    assert not [
        p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["/bin/sleep", "300"]
    ]
    daemon.start()
    assert daemon.run("ps", "-aq").strip() == ""
    daemon.stop()


def test_missing_dockerd_names_the_fix(state_dir: Path) -> None:
    """A missing dockerd binary fails with the path and the variable that points at it."""
    daemon = Dockerd(state_dir=state_dir, dockerd=str(state_dir / "no-dockerd"))
    with pytest.raises(DockerdError, match=f"dockerd not found .*{DOCKERD_ENV}"):
        daemon.start()


def test_daemon_that_cannot_start_reports_its_log(state_dir: Path) -> None:
    """A dockerd that exits while starting fails with its exit status and log tail."""
    broken = state_dir / "dockerd"
    broken.write_text("#!/bin/sh\necho 'failed to start daemon: no space' >&2\nexit 1\n")
    broken.chmod(0o755)
    daemon = Dockerd(state_dir=state_dir / "state", dockerd=str(broken))
    with pytest.raises(DockerdError, match=r"exited while starting.*no space"):
        daemon.start(timeout=10)


def _user(state_dir: Path, wait: bool) -> subprocess.Popen[str]:
    """A process that uses the daemon on demand and exits (at once, or when stdin closes)."""
    code = (
        "import sys; from worker.dockerd import Dockerd; d = Dockerd(); d.ensure(); "
        f"print(d.pid(), flush=True); {'sys.stdin.read()' if wait else ''}"
    )
    env = {**os.environ, STATE_DIR_ENV: str(state_dir)}
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip


def test_on_demand_daemon_stops_with_its_last_user(state_dir: Path) -> None:
    """An on-demand daemon outlives the user that started it and stops with its last user."""
    daemon = Dockerd(state_dir=state_dir)
    starter = _user(state_dir, wait=True)
    assert starter.stdout is not None and int(starter.stdout.readline()) > 0
    other, _ = _user(state_dir, wait=False).communicate(timeout=60)
    assert int(other) == daemon.pid(), "the second user shares the running daemon"
    assert daemon.running(), "a user's exit leaves the daemon to the others"
    starter.communicate("", timeout=60)
    assert daemon.pid() is None and not _processes_of(state_dir)
    daemon.start()  # persistent: users come and go, it stays up
    _user(state_dir, wait=False).communicate(timeout=60)
    assert daemon.running()
    daemon.stop()


def test_cli_start_status_stop(state_dir: Path) -> None:
    """``sandbench host docker start|status|stop`` drive the daemon of SANDBENCH_DOCKER_DIR."""
    env = {**os.environ, STATE_DIR_ENV: str(state_dir)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "coordinator", "host", "docker", *args]
        return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)

    started = cli("start")
    assert started.returncode == 0, started.stderr
    assert str(state_dir / "docker.sock") in started.stdout
    status = cli("status", "--json")
    assert status.returncode == 0 and '"running": true' in status.stdout
    stopped = cli("stop")
    assert stopped.returncode == 0 and "dockerd stopped" in stopped.stdout
    assert Dockerd(state_dir=state_dir).status()["running"] is False
    assert not _processes_of(state_dir)
    missing = subprocess.run(
        [sys.executable, "-m", "coordinator", "host", "docker", "start"],
        cwd=REPO, env={**env, DOCKERD_ENV: "/nonexistent/dockerd"}, capture_output=True, text=True,
    )  # fmt: skip
    assert missing.returncode == 2 and "dockerd not found at /nonexistent/dockerd" in missing.stderr
