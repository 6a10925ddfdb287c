"""The broker: URL rules, a dead broker reported fast, TLS end to end, no password in any argv."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from contract.app import checked_broker_url
from contract.broker import check_broker
from contract.errors import FleetError
from coordinator.fleet.dispatch import with_task_ids
from coordinator.plan.campaign import expand
from coordinator.plan.file import parse_plan
from coordinator.store.store import Store
from tests.conftest import REPO, require_binary
from tests.fleet_helpers import (
    PYTHON,
    REDIS_PASSWORD,
    Fleet,
    Tls,
    assert_each_once,
    dispatch,
    free_port,
    make_fleet,
    wait_finished,
    wait_until,
    write_plan,
)

pytestmark = pytest.mark.fleet
__all__ = ["make_fleet"]  # the fixture

SECRET = "s3cr3t-broker-pw"
CHECK_BOUND_S = 5.0  # the bound on a dead broker's report
SANDBENCH = str(Path(PYTHON).parent / "sandbench")  # what the systemd units run


def test_broker_url_rules(tmp_path: Path) -> None:
    """redis:// passes as given; rediss:// always verifies the certificate; bad URLs say why."""
    assert checked_broker_url(f"redis://:{SECRET}@h:1/0") == f"redis://:{SECRET}@h:1/0"
    ca = tmp_path / "ca.pem"
    ca.write_text("a CA")
    assert checked_broker_url(f"rediss://:{SECRET}@h:1/0?ssl_ca_certs={ca}") == (
        f"rediss://:{SECRET}@h:1/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"
    )
    bad = {
        f"rediss://:{SECRET}@h:1/0?ssl_cert_reqs=none": "would send the password to whoever",
        f"rediss://:{SECRET}@h:1/0?ssl_ca_certs=/nonexistent/ca.pem": "ca.pem: no such file",
        f"redis://:{SECRET}@h:1/0?ssl_ca_certs={ca}": "needs rediss:// (TLS)",
        f"amqp://:{SECRET}@h:5672//": "is not redis://[:PASSWORD@]HOST[:PORT]/DB",
        f"redis://:{SECRET}@h:99999/0": "is not redis://",
    }
    for url, message in bad.items():
        with pytest.raises(FleetError) as err:
            checked_broker_url(url)
        assert message in str(err.value) and SECRET not in str(err.value), str(err.value)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port where the kernel accepts connections that nothing ever answers (a hung broker)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def test_check_broker_names_the_address_within_5_s(
    silent_port: int, make_fleet: Any, tmp_path: Path
) -> None:
    """Refused, silent, wrong password, wrong CA: FleetError with HOST:PORT, never the password."""
    fleet = make_fleet(["lab-a"], tls=True)
    other_ca = Tls.make(tmp_path / "other", "other").ca
    dead = free_port()
    cases = {
        f"redis://:{SECRET}@127.0.0.1:{dead}/0": f"unreachable at 127.0.0.1:{dead} (Error 111",
        f"redis://:{SECRET}@127.0.0.1:{silent_port}/0": f"unreachable at 127.0.0.1:{silent_port}",
        fleet.redis.url().replace(REDIS_PASSWORD, SECRET): "refused the password",
        fleet.redis.url().replace(str(fleet.redis.tls.ca), str(other_ca)): "certificate verify",
    }
    for url, message in cases.items():
        started = time.monotonic()
        with pytest.raises(FleetError) as err:
            check_broker(checked_broker_url(url))
        elapsed = time.monotonic() - started
        assert message in str(err.value), str(err.value)
        assert SECRET not in str(err.value) and REDIS_PASSWORD not in str(err.value)
        assert elapsed < CHECK_BOUND_S, (url, elapsed)
    check_broker(checked_broker_url(fleet.redis.url()))


def test_dispatch_and_status_with_a_dead_broker_create_nothing(
    silent_port: int, tmp_path: Path
) -> None:
    """dispatch and status exit 2 naming HOST:PORT, no password shown, no campaign stored."""
    plan = write_plan(tmp_path / "plan.toml")
    data = tmp_path / "data"
    env = {**os.environ, "SANDBENCH_HOME": str(tmp_path / "home"),
           "SANDBENCH_BROKER": f"redis://:{SECRET}@127.0.0.1:{silent_port}/0"}  # fmt: skip
    dispatch = ["dispatch", str(plan), "--hosts", "lab-a", "--allow-unregistered"]
    for args in (dispatch, ["status", "c-20261201-abcd"]):
        started = time.monotonic()
        out = subprocess.run([PYTHON, "-m", "coordinator", *args, "--data", str(data)], env=env,
                             cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
        elapsed = time.monotonic() - started
        assert out.returncode == 2, (out.stdout, out.stderr)
        assert f"broker unreachable at 127.0.0.1:{silent_port}" in out.stderr, out.stderr
        assert SECRET not in out.stdout + out.stderr
        assert elapsed < 2 * CHECK_BOUND_S, elapsed  # the check's own bound is tested above
    assert not data.exists()


def test_rerun_with_a_dead_broker_plans_nothing(silent_port: int, tmp_path: Path) -> None:
    """rerun of a stored campaign's task exits 2 and leaves campaign.json byte for byte."""
    store = Store(tmp_path / "data")
    plan = parse_plan(write_plan(tmp_path / "plan.toml").read_text())
    specs = with_task_ids(expand(plan, ["lab-a"], "c-20261201-abcd", str(tmp_path / "w")))
    store.create_campaign("", plan, specs)
    before = (store.campaign_dir("c-20261201-abcd") / "campaign.json").read_bytes()
    env = {**os.environ, "SANDBENCH_BROKER": f"redis://:{SECRET}@127.0.0.1:{silent_port}/0"}
    cell = next(s for s in specs if s.kind == "environment")  # a sentinel is in no cell
    out = subprocess.run([PYTHON, "-m", "coordinator", "rerun", str(cell.task_id), "--data",
                          str(store.root)], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 2 and "broker unreachable at 127.0.0.1:" in out.stderr, out.stderr
    assert (store.campaign_dir("c-20261201-abcd") / "campaign.json").read_bytes() == before


def test_a_password_given_as_an_option_is_refused(tmp_path: Path) -> None:
    """--broker with a password exits 2 and says where the URL belongs, without echoing it."""
    out = subprocess.run(
        [PYTHON, "-m", "coordinator", "status", "c-1", "--broker", f"redis://:{SECRET}@h:1/0"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "put the whole URL in SANDBENCH_BROKER" in out.stderr
    assert SECRET not in out.stdout + out.stderr


def test_a_fleet_runs_over_tls(make_fleet: Any, tmp_path: Path) -> None:
    """A real TLS redis-server: worker, coordinator, dispatch and status all over rediss://."""
    fleet = make_fleet(["lab-a"], tls=True)
    assert fleet.redis.url().startswith("rediss://")
    fleet.register_hosts()
    fleet.start_coordinator()
    fleet.start_worker("lab-a")
    campaign = dispatch(fleet, write_plan(tmp_path / "plan.toml"), "lab-a")
    assert wait_finished(fleet, campaign)["finished"]
    assert {r.outcome for r in assert_each_once(fleet, campaign, "lab-a")} == {"passed"}
    other = fleet.redis.url().replace(str(fleet.redis.tls.ca), str(Tls.make(tmp_path, "x").ca))
    env = {**fleet.env(fleet.coordinator_home, other)}
    out = subprocess.run([PYTHON, "-m", "coordinator", "dispatch", str(tmp_path / "plan.toml"),
                          "--hosts", "lab-a", "--data", str(fleet.data)], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "certificate verify failed" in out.stderr, out.stderr
    assert Store(fleet.data).campaign_ids() == [campaign]


def _install(root: Path, *args: str) -> None:
    """Run ops/install.sh with ``--root``: files only, no packages or services."""
    out = subprocess.run(["bash", str(REPO / "ops" / "install.sh"), *args, "--root", str(root)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def _unit_argv(unit: str, paths: dict[str, str]) -> list[str]:
    """The ExecStart of an ops/systemd unit, with this machine's paths for the lab host's."""
    text = (REPO / "ops" / "systemd" / unit).read_text()
    line = re.search(r"^ExecStart=(.*)$", text, flags=re.MULTILINE)
    assert line is not None
    command = line.group(1)
    for lab, here in paths.items():
        command = command.replace(lab, here)
    return command.split()


def _env_file(path: Path) -> dict[str, str]:
    """A systemd EnvironmentFile as a dict."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _argv_of_tree(pid: int) -> list[str]:
    """The command lines (as ``ps`` shows them) of ``pid`` and every descendant."""
    proc = psutil.Process(pid)
    return [" ".join(p.cmdline()) for p in [proc, *proc.children(recursive=True)]]


def test_installed_broker_binds_where_told_and_no_argv_holds_the_password(
    tmp_path: Path,
) -> None:
    """install.sh --bind: redis listens there with its password in a 0600 include; the units'
    worker, coordinator and Flower reach it from the 0600 env file, no password in any argv."""
    server = require_binary("redis-server")
    root, port = tmp_path / "root", free_port()
    _install(root, "--role", "broker", "--bind", "127.0.0.2", "--port", str(port))
    auth = root / "etc" / "redis" / "sandbench-auth.conf"
    password = (root / "etc" / "sandbench" / "broker.password").read_text().strip()
    assert auth.stat().st_mode & 0o777 == 0o600 and password in auth.read_text()
    assert (root / "etc" / "sandbench" / "broker.password").stat().st_mode & 0o777 == 0o600
    fleet = Fleet(tmp_path / "units", [])  # its redis-server is never started: only its procs
    try:
        _check_installed(fleet, tmp_path, root, server, port)
    finally:
        fleet.close()


def _check_installed(fleet: Fleet, tmp_path: Path, root: Path, server: str, port: int) -> None:
    """Start the installed broker and the units; check binding, env file and every argv."""
    password = (root / "etc" / "sandbench" / "broker.password").read_text().strip()
    conf, state = root / "etc" / "redis" / "redis.conf", tmp_path / "redis-state"
    state.mkdir()
    fleet.spawn([server, str(conf), "--dir", str(state)], dict(os.environ), "redis")
    client = redis.Redis(host="127.0.0.2", port=port, password=password, socket_timeout=2)
    wait_until(lambda: _pings(client), 20, "the installed redis-server")
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=2).ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.2", port=port, socket_timeout=2).ping()
    url = f"redis://127.0.0.2:{port}/0"
    secret = root / "etc" / "sandbench" / "broker.password"
    _install(root, "--role", "coordinator", "--broker", url, "--password-file", str(secret))
    env_file = root / "etc" / "sandbench" / "sandbench.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    env = {**os.environ, **_env_file(env_file)}
    assert env["SANDBENCH_BROKER"] == f"redis://:{password}@127.0.0.2:{port}/0"
    _start_units(fleet, tmp_path, root, env, free_port())
    argvs = [argv for proc in fleet.procs for argv in _argv_of_tree(proc.popen.pid)]
    assert len(argvs) >= 5 and any("worker --host lab-a" in a for a in argvs), argvs
    for argv in argvs:
        assert password not in argv and "redis://" not in argv, argv


def _start_units(fleet: Fleet, tmp_path: Path, root: Path, env: dict[str, str], port: int) -> None:
    """Start the worker, coordinator and Flower units' commands; wait until each is up."""
    paths = {"/opt/sandbench/venv/bin/sandbench": SANDBENCH, "%i": "lab-a",
             "/var/lib/sandbench": str(root / "var" / "lib" / "sandbench"),
             "/var/tmp/sandbench": str(tmp_path / "work"), "--port 5555": f"--port {port}",
             "0.0.0.0": "127.0.0.1"}  # fmt: skip
    for unit in ("sandbench-worker@.service", "sandbench-coordinator.service"):
        proc = fleet.spawn(_unit_argv(unit, paths), env, unit.split("@")[0].split(".")[0])
        wait_until(lambda p=proc: " ready." in p.text() or not p.alive(), 60, f"{unit} ready")
        assert proc.alive(), proc.text()
    flower = fleet.spawn(_unit_argv("sandbench-flower.service", paths), env, "flower")
    wait_until(lambda: _listening(port) or not flower.alive(), 60, "Flower listening")
    assert flower.alive(), flower.text()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
