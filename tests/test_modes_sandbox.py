"""The sandbox mode (bubblewrap, named host): every workload passes; writes out and network fail."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_binary

from contract.records import EnvironmentSpec
from worker.modes import EnvContext, HostInfo, get_mode
from worker.runner import run_environment
from workloads.registry import WORKLOADS

SCALE = 0.02
PROBE = r"""
import json, os, socket, sys
root = sys.argv[sys.argv.index("--root") + 1]
targets = json.loads(os.environ["PROBE_TARGETS"])
result = {}
def attempt(name, action):
    try:
        action()
        result[name] = "ok"
    except OSError as exc:
        result[name] = f"{type(exc).__name__}: errno {exc.errno}"
def write(path):
    with open(path, "w") as f:
        f.write("escaped")
attempt("workspace", lambda: write(os.path.join(root, "inside.txt")))
for name, path in targets["files"].items():
    attempt(name, lambda path=path: write(path))
for name, (host, port) in targets["sockets"].items():
    attempt(name, lambda a=(host, port): socket.create_connection(a, timeout=2).close())
print(json.dumps(result))
"""


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, list[str]]]:
    """A TCP listener on all host addresses that records every connection it accepts."""
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0.1)
    accepted: list[str] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            accepted.append(peer[0])
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server, accepted
    done.set()
    thread.join(timeout=5)
    server.close()


def _host_address() -> str:
    """A non-loopback address of this host (the loopback one if there is none)."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout
    return (out.split() or ["127.0.0.1"])[0]


def test_preflight() -> None:
    """host's preflight passes here and reports the bubblewrap version."""
    require_binary("bwrap")
    preflight = get_mode("host").preflight(HostInfo())
    assert preflight.ok, preflight.reason
    assert preflight.facts["bwrap"].startswith("bubblewrap")


def test_isolation(tmp_path: Path, listener: tuple[socket.socket, list[str]]) -> None:
    """In the sandbox mode only the workspace is writable and no connection leaves the sandbox."""
    require_binary("bwrap")
    server, accepted = listener
    port = server.getsockname()[1]
    workspace, env_dir = tmp_path / "work" / "ws", tmp_path / "work" / "env"
    workspace.mkdir(parents=True)
    env_dir.mkdir()
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    outside = {
        "sibling": str(tmp_path / "work" / "outside.txt"), "etc": "/etc/sandbench-probe.txt",
        "var_tmp": "/var/tmp/sandbench-probe.txt", "repo": str(Path(__file__).with_name("x.txt")),
    }  # fmt: skip
    sockets = {"loopback": ["127.0.0.1", port], "host_address": [_host_address(), port]}
    spec = EnvironmentSpec(
        campaign="c-iso", host="local", mode="host", workload="seq-write", env_index=0,
        work_root=str(tmp_path / "work"),
    )  # fmt: skip
    env = EnvContext(spec, workspace, env_dir, "/", payload=probe)
    argv = get_mode("host").launcher(env)
    environ = {"PROBE_TARGETS": json.dumps({"files": outside, "sockets": sockets})}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=environ)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result.pop("workspace") == "ok" and (workspace / "inside.txt").exists()
    for name, path in outside.items():
        assert "errno 30" in result[name] or "errno 13" in result[name], (name, result[name])
        assert not Path(path).exists()
    for name in sockets:
        assert result[name] != "ok", name
    assert accepted == []


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_all_workloads_pass(modes_root: Path, workload: str) -> None:
    """Each workload passes inside bubblewrap: every round validated, exit 0, oracle matched."""
    require_binary("bwrap")
    spec = EnvironmentSpec(
        campaign="c-host", host="local", mode="host", workload=workload, env_index=0,
        scale=SCALE, work_root=str(modes_root),
    )  # fmt: skip
    record = run_environment(spec)
    assert record is not None and record.outcome == "passed", record and record.detail
    assert len(record.rounds) == 3 and record.oracle is not None and record.oracle.ok
