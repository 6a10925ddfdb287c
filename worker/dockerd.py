"""The worker's private Docker daemon: own socket, data root, exec root and pid file.

sandbench never talks to the system's default daemon. Its daemon lives in a state directory
(``$SANDBENCH_DOCKER_DIR``, else ``docker/`` in the sandbench home, see ``contract.paths``)::

    docker.sock  dockerd.pid  dockerd.log  daemon.json  lock  users.lock  on-demand
    data/  exec/  client/

It is started by ``sandbench host docker start`` (and stays up until ``... stop``) or on demand
by the docker mode. Every process that uses it holds a shared lock on ``users.lock``; a daemon
started on demand is stopped by the last of its users to exit.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil

from contract.environ import setting
from contract.errors import ModeUnavailable
from contract.paths import sandbench_home
from worker.procs import kill_tree

STATE_DIR_ENV = "SANDBENCH_DOCKER_DIR"
STATE_SUBDIR = "docker"  # under $SANDBENCH_HOME
DOCKERD_ENV = "SANDBENCH_DOCKERD"
DOCKER_ENV = "SANDBENCH_DOCKER"
DEFAULT_DOCKERD = "/usr/sbin/dockerd"
# The docker.io client matches the daemon; another client on PATH may be newer than its API.
DEFAULT_DOCKER = "/usr/bin/docker"

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
CLIENT_TIMEOUT_S = 120.0
POLL_S = 0.1
REMOVE_WAIT_S = 30.0
HTTP_CREATED, HTTP_NO_CONTENT, HTTP_NOT_FOUND = 201, 204, 404
LOG_TAIL_CHARS = 600
RUNSC_RUNTIME = "runsc"  # the name docker-gvisor's containers ask for
RUNSC_ARGS = ("--network=none",)
ON_DEMAND_MARK = "on-demand"  # present while the daemon was started on demand (not persistent)

# State directory -> descriptor of this process's shared lock on its ``users.lock``.
_USERS: dict[Path, int] = {}

# The daemon needs no network of its own: environment containers run with --network none and
# the host's firewall is never touched. The compose fleet's own networks still work between its
# containers, and a port it publishes (Flower's) reaches the host through docker's userland
# proxy (docker-proxy), the one way to publish without iptables rules.
DAEMON_FLAGS = (
    "--bridge=none",
    "--iptables=false",
    "--ip-masq=false",
    "--userland-proxy=true",
    "--exec-opt=native.cgroupdriver=cgroupfs",
    "--shutdown-timeout=2",
    "--log-level=warn",
)


def daemon_config() -> dict[str, Any]:
    """The daemon's whole configuration (never /etc/docker/daemon.json): gVisor's runsc as the
    runtime ``runsc`` when it is installed (the docker-gvisor mode's ``--runtime=runsc``), with
    its network off, since the daemon makes no network namespace runsc would accept for
    ``--network=none`` containers; runc stays the default runtime."""
    runsc = shutil.which(RUNSC_RUNTIME)
    if runsc is None:
        return {}
    return {"runtimes": {RUNSC_RUNTIME: {"path": runsc, "runtimeArgs": list(RUNSC_ARGS)}}}


class DockerdError(ModeUnavailable):
    """The private Docker daemon is missing, will not start, or refused a request."""


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over the daemon's unix socket (the Engine API), standard library only."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        """Connect to the unix socket instead of TCP."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def default_state_dir() -> Path:
    """The state directory named by the environment, else the default."""
    if directory := setting(STATE_DIR_ENV):
        return Path(directory)
    return sandbench_home() / STATE_SUBDIR


def default_docker_client() -> str:
    """The docker client: ``$SANDBENCH_DOCKER``, the docker.io client, or ``docker`` on PATH."""
    if docker := setting(DOCKER_ENV):
        return docker
    if Path(DEFAULT_DOCKER).exists():
        return DEFAULT_DOCKER
    return shutil.which("docker") or DEFAULT_DOCKER


@dataclass
class Dockerd:
    """One private daemon, identified by its state directory."""

    state_dir: Path = field(default_factory=default_state_dir)
    dockerd: str = field(default_factory=lambda: setting(DOCKERD_ENV) or DEFAULT_DOCKERD)
    docker: str = field(default_factory=default_docker_client)

    @property
    def socket(self) -> Path:
        """The daemon's API socket."""
        return self.state_dir / "docker.sock"

    @property
    def host_url(self) -> str:
        """``DOCKER_HOST`` value for this daemon."""
        return f"unix://{self.socket}"

    @property
    def pidfile(self) -> Path:
        """The daemon's pid file."""
        return self.state_dir / "dockerd.pid"

    @property
    def logfile(self) -> Path:
        """The daemon's stdout and stderr."""
        return self.state_dir / "dockerd.log"

    def argv(self) -> list[str]:
        """The dockerd command line for this state directory."""
        s = self.state_dir
        return [
            self.dockerd,
            f"--host={self.host_url}",
            f"--data-root={s / 'data'}",
            f"--exec-root={s / 'exec'}",
            f"--pidfile={self.pidfile}",
            f"--config-file={s / 'daemon.json'}",
            *DAEMON_FLAGS,
        ]

    def client(self, *args: str) -> list[str]:
        """A docker client command line talking to this daemon only."""
        return [self.docker, "--config", str(self.state_dir / "client"), "-H", self.host_url, *args]

    def run(self, *args: str, input: bytes | None = None, timeout: float = CLIENT_TIMEOUT_S) -> str:
        """Run a docker client command against this daemon; its stdout, or ``DockerdError``."""
        try:
            proc = subprocess.run(
                self.client(*args), input=input, check=False, capture_output=True, timeout=timeout
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DockerdError(f"docker {args[0]}: {exc}") from exc
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip()
            raise DockerdError(f"docker {' '.join(args[:2])} failed ({proc.returncode}): {err}")
        return proc.stdout.decode(errors="replace")

    def api(self, path: str, timeout: float = 5.0) -> Any:
        """GET ``path`` from the Engine API; decoded JSON (or text), ``DockerdError`` if down."""
        status, body = self.request("GET", path, timeout)
        if status != 200:
            raise DockerdError(f"dockerd API {path}: HTTP {status}: {str(body)[:200]}")
        return body

    def request(self, method: str, path: str, timeout: float = 5.0,
                body: dict[str, Any] | None = None) -> tuple[int, Any]:  # fmt: skip
        """One Engine API request (``body`` sent as JSON): its HTTP status and decoded JSON (or
        text); ``DockerdError`` if the daemon does not answer. A request costs about a
        millisecond, a ``docker`` client command 25-35 ms (the client's own start), so the calls
        made around every environment (its container's creation, OOM flag and removal) use
        this."""
        conn = _UnixHTTPConnection(self.socket, timeout)
        try:
            if body is None:
                conn.request(method, path)
            else:
                conn.request(method, path, json.dumps(body).encode(),
                             {"Content-Type": "application/json"})  # fmt: skip
            resp = conn.getresponse()
            text = resp.read().decode(errors="replace")
        except OSError as exc:
            raise DockerdError(f"private dockerd at {self.socket} is not answering: {exc}") from exc
        finally:
            conn.close()
        if resp.getheader("Content-Type") == "application/json" and text:
            return resp.status, json.loads(text)
        return resp.status, text

    def container(self, name: str) -> dict[str, Any] | None:
        """The container called ``name`` as ``docker inspect`` shows it, None if there is none."""
        status, body = self.request("GET", f"/containers/{quote(name, safe='')}/json")
        if status == HTTP_NOT_FOUND:
            return None
        if status != 200 or not isinstance(body, dict):
            raise DockerdError(f"dockerd API inspect {name}: HTTP {status}: {str(body)[:200]}")
        return body

    def create_container(self, name: str, body: dict[str, Any]) -> str:
        """``docker create`` through the API: the new container's id (``body`` as the Engine
        API's ``ContainerCreate`` takes it)."""
        path = f"/containers/create?name={quote(name, safe='')}"
        status, found = self.request("POST", path, CLIENT_TIMEOUT_S, body)
        if status != HTTP_CREATED or not isinstance(found, dict) or "Id" not in found:
            raise DockerdError(f"docker create {name} failed: HTTP {status}: {str(found)[:300]}")
        return str(found["Id"])

    def remove_container(self, name: str, timeout: float = REMOVE_WAIT_S) -> None:
        """``docker rm --force --volumes name`` through the API, until the daemon no longer has
        it (a removal already in progress is waited for); none there is no error."""
        deadline = time.monotonic() + timeout
        path = f"/containers/{quote(name, safe='')}?force=1&v=1"
        while True:
            status, body = self.request("DELETE", path)
            if status in (HTTP_NO_CONTENT, HTTP_NOT_FOUND) and self.container(name) is None:
                return
            if time.monotonic() > deadline:
                raise DockerdError(f"container {name} is not removed: HTTP {status}: "
                                   f"{str(body)[:200]}")  # fmt: skip
            time.sleep(POLL_S)  # e.g. 409: its removal is already in progress

    def pid(self) -> int | None:
        """Pid of the running daemon of this state directory, from its pid file."""
        try:
            pid = int(self.pidfile.read_text().strip())
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE and "dockerd" in proc.name():
                return pid
        except (OSError, ValueError, psutil.Error):
            pass
        return None

    def ping(self) -> bool:
        """Whether the daemon answers ``/_ping``."""
        try:
            return bool(self.api("/_ping", timeout=2.0) == "OK")
        except DockerdError:
            return False

    def running(self) -> bool:
        """Whether this daemon is up and answering."""
        return self.pid() is not None and self.ping()

    def status(self) -> dict[str, Any]:
        """Facts about the daemon: state, pid, socket, versions, drivers."""
        facts: dict[str, Any] = {
            "running": False,
            "pid": self.pid(),
            "socket": str(self.socket),
            "state_dir": str(self.state_dir),
            "dockerd": self.dockerd,
            "client": self.docker,
        }
        if facts["pid"] is not None and self.ping():
            version = self.api("/version")
            info = self.api("/info")
            facts.update(
                running=True,
                version=version.get("Version"),
                api_version=version.get("ApiVersion"),
                storage_driver=info.get("Driver"),
                cgroup_driver=info.get("CgroupDriver"),
                cgroup_version=info.get("CgroupVersion"),
                runtimes=sorted(info.get("Runtimes") or {}),
                containers=info.get("Containers"),
                images=info.get("Images"),
            )
        return facts

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialize start and stop between processes sharing this state directory."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.state_dir / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def check_binary(self) -> None:
        """Raise ``DockerdError`` naming the fix when dockerd or the client is missing."""
        if not (os.path.isfile(self.dockerd) and os.access(self.dockerd, os.X_OK)):
            raise DockerdError(
                f"dockerd not found at {self.dockerd} (install docker.io with ops/setup.sh, "
                f"or point {DOCKERD_ENV} at it)"
            )
        if not (os.path.isfile(self.docker) and os.access(self.docker, os.X_OK)):
            raise DockerdError(
                f"docker client not found at {self.docker} (install docker.io with "
                f"ops/setup.sh, or point {DOCKER_ENV} at it)"
            )

    def start(self, timeout: float = READY_TIMEOUT_S, persistent: bool = True) -> bool:
        """Start the daemon unless it runs; wait until it answers. True if started now.

        A persistent daemon stays up until ``stop``; an on-demand one (``ensure``) is stopped
        by its last user's exit. Starting persistently makes a running daemon persistent.
        """
        self.check_binary()
        with self._locked():
            mark = self.state_dir / ON_DEMAND_MARK
            if persistent:
                mark.unlink(missing_ok=True)
            if self.running():
                return False
            if self.pid() is not None:  # alive but not answering: still starting, or hung
                self._wait_ready(None, timeout)
                return False
            if not persistent:
                mark.touch()
            self._spawn_and_wait(timeout)
        return True

    def ensure(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Use the daemon, starting it on demand; an on-demand daemon stops with its last user."""
        self.check_binary()
        self._hold_use()
        if not self.running():
            self.start(timeout, persistent=False)

    def _hold_use(self) -> None:
        """Mark this process as a user until it exits (a shared lock on ``users.lock``)."""
        key = self.state_dir.resolve()
        if key in _USERS:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.state_dir / "users.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        _USERS[key] = fd
        atexit.register(self._release_use)

    def _release_use(self) -> None:
        """At exit: drop this process's use; the last user stops an on-demand daemon."""
        fd = _USERS.pop(self.state_dir.resolve(), None)
        if fd is not None:
            os.close(fd)
        if not (self.state_dir / ON_DEMAND_MARK).exists():
            return  # started by ``sandbench host docker start``: it stays up
        probe = os.open(self.state_dir / "users.lock", os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another process still uses it; the last one stops it
        else:
            if (self.state_dir / ON_DEMAND_MARK).exists():
                with contextlib.suppress(DockerdError):
                    self.stop()
        finally:
            os.close(probe)

    def _spawn_and_wait(self, timeout: float) -> None:
        """Spawn dockerd detached (its own session, not our child) and wait for its API."""
        for stale in (self.pidfile, self.socket):
            stale.unlink(missing_ok=True)
        # hermetic: never read /etc/docker/daemon.json; written anew at each start
        (self.state_dir / "daemon.json").write_text(json.dumps(daemon_config()) + "\n")
        # The shell starts dockerd in the background and exits, so the daemon outlives this
        # process's children and is owned by its pid file, not by a Popen object.
        spawn = f'"$@" >>"{self.logfile}" 2>&1 </dev/null & echo $!'
        out = subprocess.run(
            ["/bin/sh", "-c", spawn, "sh", *self.argv()],
            capture_output=True, text=True, check=True, start_new_session=True,
        )  # fmt: skip
        self._wait_ready(int(out.stdout.strip()), timeout)

    def _wait_ready(self, pid: int | None, timeout: float) -> None:
        """Poll ``/_ping`` until the daemon answers; ``DockerdError`` with its log otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ping():
                return
            if pid is not None and not _alive(pid):
                raise DockerdError(f"dockerd exited while starting; {self._log_tail()}")
            time.sleep(POLL_S)
        if pid is not None:
            kill_tree(pid)
        raise DockerdError(f"dockerd did not answer within {timeout:.0f} s; {self._log_tail()}")

    def _log_tail(self) -> str:
        """The end of the daemon's log, for error messages."""
        try:
            text = self.logfile.read_text(errors="replace").strip()
        except OSError:
            return f"no log at {self.logfile}"
        return f"{self.logfile} ends: {text[-LOG_TAIL_CHARS:]}"

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Remove every container of this daemon, then stop it. True if it was running."""
        with self._locked():
            (self.state_dir / ON_DEMAND_MARK).unlink(missing_ok=True)
            pid = self.pid()
            if pid is None:
                return False
            if self.ping():
                with contextlib.suppress(DockerdError):  # a hung daemon is stopped anyway
                    self.remove_all_containers()
            _terminate(pid, timeout)
            self._kill_orphans()
            self.pidfile.unlink(missing_ok=True)
            self.socket.unlink(missing_ok=True)
        return True

    def remove_all_containers(self) -> None:
        """Force-remove every container this daemon knows (all of them are sandbench's)."""
        ids = self.run("ps", "-aq").split()
        if ids:
            self.run("rm", "-f", *ids)

    def _kill_orphans(self) -> None:
        """Kill the managed containerd and shims left by a daemon that had to be killed."""
        exec_root = str(self.state_dir / "exec")
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if any(exec_root in arg for arg in cmdline):
                kill_tree(proc.pid)

    def mounts(self) -> list[Path]:
        """Mount points under the state directory (overlays, netns), deepest first."""
        root = os.path.realpath(self.state_dir)
        found = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].encode().decode("unicode_escape")
            if point == root or point.startswith(root + "/"):
                found.append(Path(point))
        return sorted(found, key=lambda p: len(p.parts), reverse=True)

    def purge(self) -> None:
        """Stop the daemon and delete its whole state directory (images, containers, logs)."""
        self.stop()
        for point in self.mounts():
            subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
        shutil.rmtree(self.state_dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not count)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _terminate(pid: int, timeout: float) -> None:
    """SIGTERM ``pid``, wait up to ``timeout``, then SIGKILL its whole tree."""
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout)
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        kill_tree(pid)
