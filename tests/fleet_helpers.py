"""Real parts for fleet tests: a private redis-server, network namespaces, worker processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from contract.records import EnvironmentRecord
from contract.signing import COORDINATOR_KEY_FILE, CoordinatorKey, HostKey
from coordinator.store.store import Store
from coordinator.store.trust import own_coordinator_key
from tests.conftest import require, require_binary
from worker.config import ALLOW_KEY, WORKER_CONFIG, trust_coordinator

PYTHON = sys.executable
REPO = Path(__file__).resolve().parents[1]
REDIS_PASSWORD = "fleet-test-secret"
# Short delivery clocks so fault tests finish in seconds (production: 900 s and 10 s).
VISIBILITY_TIMEOUT_S = 6
RESTORE_INTERVAL_S = 1
LOST_GRACE_S = 4
LEASE_SLACK_S = 3  # a queued environment never started: queued again after limit_s + this
STOP_TIMEOUT_S = 15
# The fsync policy of the lab's Redis (ops/redis.conf); benchmarks use it.
OPS_APPENDFSYNC = next(
    line.split()[1]
    for line in (REPO / "ops" / "redis.conf").read_text().splitlines()
    if line.startswith("appendfsync ")
)
# Addresses of the veth pairs: 198.18.0.0/15 is reserved for network benchmark tests (RFC 2544).
NETNS_SUBNET = "198.18.{index}.{host}"
VETH_FIRST, VETH_INDEXES = 2, 250  # the third octet (and veth names sbv<index>h/n) in use
# Command modes the test lab hosts' own configuration allows (worker.toml): the fleet tests'.
ALLOWED_COMMAND_MODES = ("slow", "flaky", "always-fails", "absent")

T = TypeVar("T")


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(check: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll ``check`` until it returns something true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Tls:
    """A throw-away CA and a server certificate it signed, for 127.0.0.1 (made by openssl)."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def make(cls, directory: Path, name: str = "test") -> Tls:
        """Generate the CA and the server's key and certificate under ``directory``."""
        openssl = require_binary("openssl")
        directory.mkdir(parents=True, exist_ok=True)
        ca, ca_key = directory / f"{name}-ca.pem", directory / f"{name}-ca.key"
        cert, key, csr = (directory / f"{name}-server.{x}" for x in ("pem", "key", "csr"))
        ext = directory / f"{name}-san.cnf"
        ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for argv in (
            ["req", "-x509", "-newkey", "ed25519", "-nodes", "-keyout", ca_key, "-out", ca,
             "-days", "2", "-subj", f"/CN={name} CA"],
            ["req", "-newkey", "ed25519", "-nodes", "-keyout", key, "-out", csr,
             "-subj", "/CN=127.0.0.1"],
            ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
             "-out", cert, "-days", "2", "-extfile", ext],
        ):  # fmt: skip
            subprocess.run([openssl, *map(str, argv)], check=True, capture_output=True)
        return cls(ca, cert, key)


class RedisServer:
    """A redis-server on a free port in a private directory, append-only, with a password.

    Every setting, the password included, is in a 0600 configuration file: nothing secret on
    its command line. With ``tls`` it listens for TLS only (``rediss://``).
    """

    def __init__(
        self, directory: Path, binds: list[str] | None = None, appendfsync: str = "always",
        tls: Tls | None = None,
    ) -> None:  # fmt: skip
        self.appendfsync = appendfsync  # always: a kill -9 of the server loses nothing
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.binds = ["127.0.0.1", *(binds or [])]
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, address: str = "127.0.0.1") -> str:
        """Broker URL of this server as reached at ``address``."""
        if self.tls:
            return f"rediss://:{REDIS_PASSWORD}@{address}:{self.port}/0?ssl_ca_certs={self.tls.ca}"
        return f"redis://:{REDIS_PASSWORD}@{address}:{self.port}/0"

    def config(self) -> Path:
        """Write the server's configuration file (mode 0600); its path."""
        ports = [f"port {self.port}"]
        if self.tls:
            ports = ["port 0", f"tls-port {self.port}", f'tls-cert-file "{self.tls.cert}"',
                     f'tls-key-file "{self.tls.key}"', "tls-auth-clients no"]  # fmt: skip
        lines = [*ports, f"bind {' '.join(self.binds)}", f'dir "{self.dir}"', "appendonly yes",
                 f"appendfsync {self.appendfsync}", 'save ""', f"requirepass {REDIS_PASSWORD}",
                 "protected-mode no", f'logfile "{self.dir / "redis.log"}"']  # fmt: skip
        path = self.dir / "redis.conf"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        argv = ["redis-server", str(self.config())]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url(), socket_timeout=2)
        try:
            wait_until(lambda: self._pings(client), 20, "redis-server to answer PING")
        finally:
            client.close()

    def _pings(self, client: redis.Redis) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            log = (self.dir / "redis.log").read_text()[-2000:]
            raise AssertionError(f"redis-server exited: {log}")
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (SIGKILL simulates a crash; the append-only file survives)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(STOP_TIMEOUT_S)
        self.proc = None

    def restart(self, down_s: float = 1.0) -> None:
        """Kill the server, stay down ``down_s`` seconds, start it again from its AOF."""
        self.stop(signal.SIGKILL)
        time.sleep(down_s)
        self.start()

    def client(self) -> redis.Redis:
        """A client of this server (close it when done)."""
        return redis.Redis.from_url(self.url(), decode_responses=True)


@dataclass
class NetNs:
    """A network namespace joined to the root namespace by a veth pair.

    Tests run side by side on one machine: ``create`` takes the first free veth index from
    ``index`` on (``ip link add`` fails on a name in use), and ``delete`` removes only the pair
    this namespace created, never another test's.
    """

    name: str
    index: int  # preferred; the one in use after ``create``
    created: bool = False

    @property
    def host_address(self) -> str:
        """The root namespace's end of the veth pair (where Redis listens)."""
        return NETNS_SUBNET.format(index=self.index, host=1)

    @property
    def ns_address(self) -> str:
        """The namespace's own address."""
        return NETNS_SUBNET.format(index=self.index, host=2)

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    @property
    def link(self) -> str:
        """The root namespace's end of the veth pair (``ip link set LINK down`` cuts it off)."""
        return f"sbv{self.index}h"

    def create(self) -> None:
        """Create the namespace, a veth pair on a free index and both addresses."""
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)  # a stale one
        self._ip("netns", "add", self.name)
        first = self.index - VETH_FIRST
        for offset in range(VETH_INDEXES):
            self.index = VETH_FIRST + (first + offset) % VETH_INDEXES
            argv = ["ip", "link", "add", self.link, "type", "veth", "peer", "name",
                    f"sbv{self.index}n", "netns", self.name]  # fmt: skip
            if subprocess.run(argv, capture_output=True).returncode == 0:
                break
        else:
            raise AssertionError("no free veth index for a test network namespace")
        self.created = True
        outer, inner = self.link, f"sbv{self.index}n"
        self._ip("addr", "add", f"{self.host_address}/30", "dev", outer)
        self._ip("link", "set", outer, "up")
        self._ip("-n", self.name, "addr", "add", f"{self.ns_address}/30", "dev", inner)
        self._ip("-n", self.name, "link", "set", inner, "up")
        self._ip("-n", self.name, "link", "set", "lo", "up")

    def delete(self) -> None:
        """Remove the namespace and the veth pair it created (the pair goes with it)."""
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        if self.created:
            subprocess.run(["ip", "link", "del", self.link], capture_output=True)
            self.created = False


class Proc:
    """A fleet process in its own session, logging to a file; killed with its whole group."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv, self.log = argv, log
        self.offset = log.stat().st_size if log.exists() else 0  # a restart appends to the log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=REPO,
            )  # fmt: skip

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.popen.poll() is None

    def kill9(self) -> None:
        """SIGKILL the process and every child it started."""
        self._signal_group(signal.SIGKILL)
        self.popen.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM the group, then SIGKILL what is left; reaps the process."""
        self._signal_group(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(STOP_TIMEOUT_S)
        self._signal_group(signal.SIGKILL)
        self.popen.wait(STOP_TIMEOUT_S)

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def text(self) -> str:
        """Everything the process logged so far."""
        return self.log.read_text(errors="replace")

    def own_text(self) -> str:
        """What this process logged (not an earlier process of the same log)."""
        return self.log.read_bytes()[self.offset :].decode(errors="replace")


@dataclass
class LabHost:
    """One lab host of a test fleet: its name, key home and work root."""

    name: str
    home: Path
    work_root: Path
    netns: NetNs | None = None
    key: HostKey = field(init=False)

    def __post_init__(self) -> None:
        self.work_root.mkdir(parents=True, exist_ok=True)
        self.key = HostKey.load_or_create(self.home / "host.key", name=self.name)
        modes = ", ".join(f'"{m}"' for m in ALLOWED_COMMAND_MODES)
        (self.home / WORKER_CONFIG).write_text(f"{ALLOW_KEY} = [{modes}]\n")

    def trust(self, coordinator: CoordinatorKey) -> None:
        """Install ``coordinator``'s public key as the one this host's worker trusts."""
        trust_coordinator(coordinator.public_b64(), self.home, replace=True)


class Fleet:
    """A test fleet: redis-server, coordinator home and data, lab hosts and their workers."""

    def __init__(
        self, root: Path, host_names: list[str], netns_prefix: str | None = None,
        tls: Tls | None = None,
    ) -> None:  # fmt: skip
        self.root = root
        self.data = root / "data"
        self.coordinator_home = root / "coordinator-home"
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        # the coordinator's key (signs specs, links, heads), trusted by its registry and hosts
        self.coordinator_key = own_coordinator_key(self.coordinator_home / COORDINATOR_KEY_FILE)
        self.hosts: dict[str, LabHost] = {}
        for i, name in enumerate(host_names, start=1):
            ns = NetNs(f"{netns_prefix}-{name}", VETH_FIRST + (os.getpid() * 8 + i) % VETH_INDEXES)
            ns = ns if netns_prefix else None
            self.hosts[name] = LabHost(name, root / f"home-{name}", root / f"work-{name}", ns)
            self.hosts[name].trust(self.coordinator_key)
        for host in self.hosts.values():
            if host.netns:
                host.netns.create()
        binds = [h.netns.host_address for h in self.hosts.values() if h.netns]
        self.redis = RedisServer(root / "redis", binds, appendfsync=OPS_APPENDFSYNC, tls=tls)
        self.procs: list[Proc] = []
        self.workers: dict[str, Proc] = {}
        self.coordinator: Proc | None = None

    def register_hosts(self, names: list[str] | None = None) -> None:
        """Trust the named hosts' keys in the coordinator's registry (all hosts by default)."""
        from coordinator.store.trust import HostRegistry

        registry = HostRegistry(self.coordinator_home / "hosts.json")
        for name in names or list(self.hosts):
            registry.add(name, self.hosts[name].key.public_b64())

    def env(self, home: Path, broker: str) -> dict[str, str]:
        """Environment of one fleet process."""
        env = dict(os.environ)
        env.update(
            SANDBENCH_HOME=str(home), SANDBENCH_BROKER=broker, PYTHONUNBUFFERED="1",
            SANDBENCH_VISIBILITY_TIMEOUT=str(VISIBILITY_TIMEOUT_S),
            SANDBENCH_RESTORE_INTERVAL=str(RESTORE_INTERVAL_S),
            SANDBENCH_LOST_GRACE=str(LOST_GRACE_S), SANDBENCH_LEASE_SLACK=str(LEASE_SLACK_S),
        )  # fmt: skip
        return env

    def spawn(self, argv: list[str], env: dict[str, str], log_name: str) -> Proc:
        """Start a process of this fleet (stopped by ``close``), logging to ``log_name``."""
        proc = Proc(argv, env, self.logs / f"{log_name}.log")
        self.procs.append(proc)
        return proc

    def start_worker(self, name: str) -> Proc:
        """Start host ``name``'s worker (inside its namespace when it has one)."""
        host = self.hosts[name]
        address = host.netns.host_address if host.netns else "127.0.0.1"
        argv = [PYTHON, "-m", "coordinator", "worker", "--host", name,
                "--work-root", str(host.work_root), "--loglevel", "INFO"]  # fmt: skip
        if host.netns:  # nsenter, not `ip netns exec`: that remounts /sys and hides cgroups
            argv = ["nsenter", f"--net=/run/netns/{host.netns.name}", "--", *argv]
        proc = self.spawn(argv, self.env(host.home, self.redis.url(address)), f"worker-{name}")
        self.workers[name] = proc
        wait_until(lambda: " ready." in proc.own_text() or not proc.alive(), 60, f"{name} ready")
        assert proc.alive(), proc.text()
        return proc

    def start_coordinator(self) -> Proc:
        """Start the coordinator on queue ``coordinator`` next to the store."""
        argv = [PYTHON, "-m", "coordinator", "coordinator", "--data", str(self.data)]
        proc = self.spawn(argv, self.env(self.coordinator_home, self.redis.url()), "coordinator")
        self.coordinator = proc
        ready = lambda: " ready." in proc.own_text() or not proc.alive()  # noqa: E731
        wait_until(ready, 60, "coordinator ready")
        assert proc.alive(), proc.text()
        return proc

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``sandbench ARGS`` as the operator would, against this fleet."""
        env = self.env(self.coordinator_home, self.redis.url())
        return subprocess.run(
            [PYTHON, "-m", "coordinator", *args], env=env, cwd=REPO, text=True,
            capture_output=True, timeout=timeout,
        )  # fmt: skip

    def logs_text(self) -> str:
        """Every process log, for assertion messages."""
        return "\n".join(f"--- {p.log.name}\n{p.text()[-3000:]}" for p in self.procs)

    def close(self) -> None:
        """Stop every process, the redis-server and the namespaces."""
        for proc in self.procs:
            proc.stop()
        self.redis.stop()
        for host in self.hosts.values():
            if host.netns:
                host.netns.delete()


def write_plan(path: Path, **fields: Any) -> Path:
    """A small TOML plan at ``path`` (native publish at tiny scale unless overridden)."""
    plan: dict[str, Any] = {
        "name": "fleet-test", "seed": 7, "environments": 2, "rounds": 2, "limit_s": 30,
        "scale": 0.02, "workloads": ["publish", "seq-write"], "modes": ["native"],
        "quota": {"cpus": "0,1", "cpu_quota": 2.0, "memory": "1GiB", "swap": "0"},
    }  # fmt: skip
    plan.update(fields)
    lines = []
    tables = {k: v for k, v in plan.items() if isinstance(v, dict)}
    for key, value in plan.items():
        if key not in tables:
            lines.append(f"{key} = {_toml(value)}")
    for key, table in tables.items():
        lines.append(f"[{key}]")
        lines += [f"{k} = {_toml(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml(value: Any) -> str:
    """A TOML literal for the simple values plans use."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def slow_mode(name: str, delay_s: float) -> dict[str, Any]:
    """A command mode that waits ``delay_s`` before starting the payload (room for faults)."""
    script = f'sleep {delay_s}; exec "$@"'
    return {"name": name, "template": ["/bin/sh", "-c", script, name, "{payload_argv}"]}


def flaky_mode(name: str, flag: Path) -> dict[str, Any]:
    """A command mode that fails (exit 3, no Ready) until the file ``flag`` exists."""
    script = f'test -e {flag} || exit 3; exec "$@"'
    return {"name": name, "template": ["/bin/sh", "-c", script, name, "{payload_argv}"]}


def remove_leftover_cgroups(campaign: str) -> None:
    """Kill and remove environment cgroups of ``campaign`` that a killed worker left behind."""
    from worker.cgroups import PARENT_NAME, cgroup_mounts

    for mount in set(cgroup_mounts().values()):
        parent = mount / PARENT_NAME
        for group in parent.glob(f"{campaign}*") if parent.is_dir() else []:
            procs = group / "cgroup.procs"
            for pid in procs.read_text().split() if procs.exists() else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(OSError):
                wait_until(
                    lambda g=group: not (g / "cgroup.procs").read_text().strip(), 10, "empty"
                )
                group.rmdir()


CAMPAIGN_BOUND_S = 240  # a whole small campaign, dispatch to last finalization


@pytest.fixture
def make_fleet(tmp_path: Path) -> Iterator[Any]:
    """Factory of test fleets (redis-server, workers, coordinator), all stopped afterwards."""
    require_binary("redis-server")
    fleets: list[Fleet] = []

    def make(hosts: list[str], netns: bool = False, tls: bool = False) -> Fleet:
        if netns:
            require(os.geteuid() == 0 and bool(require_binary("ip")), "root for ip netns")
        prefix = f"sbt{os.getpid() % 10000}" if netns else None
        root = tmp_path / f"fleet{len(fleets)}"
        fleet = Fleet(root, hosts, prefix, Tls.make(root / "tls") if tls else None)
        fleets.append(fleet)
        fleet.redis.start()
        return fleet

    yield make
    for fleet in fleets:
        fleet.close()


def dispatch(fleet: Fleet, plan: Path, hosts: str, *options: str) -> str:
    """Run ``sandbench dispatch`` and return the campaign id from its last line."""
    out = fleet.cli("dispatch", str(plan), "--hosts", hosts, "--data", str(fleet.data), *options)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("campaign: "), out.stdout
    return last.split(": ", 1)[1]


def status(fleet: Fleet, campaign: str) -> dict[str, Any]:
    """``sandbench status ID --json`` as a dict."""
    out = fleet.cli("status", campaign, "--json", "--data", str(fleet.data))
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def wait_finished(fleet: Fleet, campaign: str, timeout: float = CAMPAIGN_BOUND_S) -> dict[str, Any]:
    """Wait until every host of ``campaign`` is finalized; its final status."""
    try:
        wait_until(lambda: status(fleet, campaign)["finished"], timeout, "every host finalized", 1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{status(fleet, campaign)}\n{fleet.logs_text()}") from None
    return status(fleet, campaign)


def store_of(fleet: Fleet) -> Store:
    """The fleet's store as the coordinator writes it (signed with the coordinator's key)."""
    return Store(fleet.data, signer=fleet.coordinator_key)


def records_of(fleet: Fleet, campaign: str, host: str) -> list[EnvironmentRecord]:
    """Stored records of one host."""
    return Store(fleet.data).records(campaign, host)


def assert_each_once(fleet: Fleet, campaign: str, host: str) -> list[EnvironmentRecord]:
    """Every planned environment of ``host`` has exactly one record, all from ``host``."""
    planned = Store(fleet.data).load_campaign(campaign).host_specs(host)
    records = records_of(fleet, campaign, host)
    keys = [r.key() for r in records]
    assert sorted(keys) == sorted(s.key() for s in planned), (keys, fleet.logs_text())
    assert {r.host for r in records} == {host}
    return records
