"""Fleet configuration: Celery settings, Flower naming, compose file, systemd units, redis.conf."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import redis

from contract.app import celery_config, describe, host_queue
from contract.records import EnvironmentSpec
from tests.conftest import REPO, require, require_binary
from tests.fleet_helpers import PYTHON, free_port, wait_until

pytestmark = pytest.mark.fleet

COMPOSE_ENV = {"SANDBENCH_REDIS_PASSWORD": "compose-test", "SANDBENCH_FLOWER_AUTH": "a:b"}


def test_celery_settings_shape_delivery_as_the_design_says() -> None:
    """JSON only, late acks, reject on loss, prefetch 1, explicit visibility timeout, events on."""
    conf = celery_config("redis://127.0.0.1:6379/0")
    assert conf["accept_content"] == ["json"] and conf["result_accept_content"] == ["json"]
    assert conf["task_serializer"] == conf["result_serializer"] == "json"
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1 and conf["worker_disable_prefetch"]
    assert conf["broker_transport_options"]["visibility_timeout"] == 900
    assert conf["result_extended"] and conf["worker_send_task_events"]
    assert conf["task_send_sent_event"]
    assert host_queue("lab-a") == "host.lab-a"


def test_flower_shows_an_environment_by_host_cell_and_index() -> None:
    """A run_environment task is shown as ``lab-a staged/publish #2``."""
    spec = EnvironmentSpec(campaign="c-1", host="lab-a", mode="staged", workload="publish",
                           env_index=2, work_root="/tmp/w")  # fmt: skip
    assert describe(spec) == "lab-a staged/publish #2"
    assert describe(spec.model_copy(update={"attempt": 2})) == "lab-a staged/publish #2 attempt 2"


def test_flower_refuses_to_start_without_basic_auth() -> None:
    """``sandbench flower`` without credentials exits 2 and says how to set them."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    out = subprocess.run([PYTHON, "-m", "coordinator", "flower"], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "SANDBENCH_FLOWER_AUTH=user:password" in out.stderr


def test_docker_compose_file_is_valid() -> None:
    """``docker-compose config`` accepts the fleet: redis, coordinator, two workers, flower."""
    compose = shutil.which("docker-compose")
    require(compose is not None, "docker-compose (Debian package; installed by ops/setup.sh)")
    assert compose is not None
    env = {"PATH": "/usr/bin:/bin", **COMPOSE_ENV}
    out = subprocess.run([compose, "config", "--services"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.split()) == {"redis", "coordinator", "lab-a", "lab-b", "flower"}
    full = subprocess.run([compose, "config"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60).stdout  # fmt: skip
    assert "requirepass %s" in full and "--requirepass" not in full  # never on a command line
    assert "SANDBENCH_FLOWER_AUTH: a:b" in full
    for host in ("lab-a", "lab-b"):  # keys apart: a private key on one volume, in one service
        assert full.count(f"- {host}-home:") == 1
        assert full.count(f"- {host}-home:/var/lib/sandbench/home:rw") == 1
        assert full.count(f"- {host}-pub:/var/lib/sandbench/pubkeys/{host}:rw") == 1
        assert full.count(f"- {host}-pub:/var/lib/sandbench/pubkeys/{host}:ro") == 1
    assert full.count("- coordinator-data:") == 1 and "sandbench-data" not in full
    missing = subprocess.run([compose, "config"], cwd=REPO, env={"PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode != 0 and "SANDBENCH_REDIS_PASSWORD" in missing.stderr


def test_systemd_units_verify(tmp_path: Path) -> None:
    """``systemd-analyze verify`` accepts the worker, coordinator and Flower units."""
    analyze = require_binary("systemd-analyze")
    units = []
    for unit in (REPO / "ops" / "systemd").glob("*.service"):
        text = unit.read_text().replace("/opt/sandbench/venv/bin/sandbench", "/bin/true")
        name = unit.name.replace("@.service", "@lab-a.service")
        (tmp_path / name).write_text(text)
        units.append(str(tmp_path / name))
    assert len(units) == 3
    out = subprocess.run([analyze, "verify", *units], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr


def test_redis_conf_starts_a_persistent_server(tmp_path: Path) -> None:
    """redis-server runs with ops/redis.conf: append-only, fsync always, no eviction, password."""
    server = require_binary("redis-server")
    port = free_port()
    auth = tmp_path / "auth.conf"  # the password in an include, as install.sh does: not in argv
    auth.write_text("requirepass conf-test\n")
    auth.chmod(0o600)
    conf = tmp_path / "redis.conf"
    conf.write_text(f"include {REPO / 'ops' / 'redis.conf'}\ninclude {auth}\nport {port}\n")
    argv = [server, str(conf), "--dir", str(tmp_path)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, password="conf-test", decode_responses=True)
    try:
        wait_until(lambda: _pings(client), 20, "redis-server with ops/redis.conf")
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("appendfsync")["appendfsync"] == "always"
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
    finally:
        client.close()
        proc.terminate()
        proc.wait(15)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_install_script_parses() -> None:
    """ops/install.sh is valid bash and prints its usage for an unknown role."""
    assert subprocess.run(["bash", "-n", str(REPO / "ops" / "install.sh")]).returncode == 0
    out = subprocess.run(["bash", str(REPO / "ops" / "install.sh"), "--role", "nonsense"],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert out.returncode == 2 and "--role worker --host lab-a" in out.stdout
