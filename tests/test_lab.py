"""The fleet on real systemd lab hosts: ``ops/lab.sh up 3``, provisioned offline by install.sh.

One lab for the module (booting and provisioning it costs ~10 minutes under TCG): lab-c is the
broker and coordinator, lab-a and lab-b workers, each started by systemd from its unit. Every
check runs inside the guests over SSH: units, the journal, the environment cgroups under the
worker unit's delegated subtree during a round, the campaign's verdict and report, and nothing
left behind.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import lab as labmod
from testbed.provision import Fleet, provision
from tests.conftest import require, require_binary
from tests.fleet_helpers import wait_until
from worker.vm import guest, kernel, qemu

pytestmark = [pytest.mark.lab, pytest.mark.vm, pytest.mark.slow]

PLAN = """\
name = "lab"
seed = 11
environments = 2
rounds = 2
scale = 0.02
limit_s = 90
workloads = ["publish", "seq-write", "create-small"]
modes = ["native", "host", "staged"]
"""
CAMPAIGN_TIMEOUT_S = 1800.0
UNIT_CGROUP = (
    "/sys/fs/cgroup/system.slice/system-sandbench\\x2dworker.slice/sandbench-worker@{}.service"
)
CLOCK_OFFSET_S = 3600  # lab-b's clock is an hour ahead


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[labmod.Lab, Fleet]]:
    """Three lab hosts, provisioned; removed with everything in them after the module."""
    require(qemu.qemu_binary() is not None, f"{qemu.QEMU} (ops/setup.sh)")
    require_binary("sshd")
    prepared = guest.load_guest()
    require(prepared is not None and guest.modules_problem(prepared, kernel.LAB_MODULES) is None,
            "the prepared guest kernel with the lab's modules (sandbench vm prepare)")  # fmt: skip
    directory = tmp_path_factory.mktemp("lab") / "lab"
    made = labmod.up(directory, 3, labmod.DEFAULT_MEMORY_MIB, {"lab-b": CLOCK_OFFSET_S})
    try:
        for host in made.hosts:
            labmod.wait_ready(made, host.name)
        labmod.build_wheels(made)
        yield made, provision(made)
    finally:
        labmod.down(directory)


def sh(lab: labmod.Lab, name: str, line: str) -> str:
    """``line``'s output on host ``name`` (failing the test when it fails)."""
    return lab.run(name, line, timeout=600).stdout


def test_each_role_runs_as_a_systemd_unit_with_its_log_in_the_journal(
    lab: tuple[labmod.Lab, Fleet],
) -> None:
    made, fleet = lab
    assert fleet.coordinator == "lab-c" and fleet.workers == ("lab-a", "lab-b")
    active = sh(made, "lab-c", "systemctl is-active redis-server sandbench-coordinator "
                "sandbench-flower").split()  # fmt: skip
    assert active == ["active"] * 3
    for name in fleet.workers:
        assert sh(made, name, "cat /proc/1/comm").strip() == "systemd"
        assert sh(made, name, f"systemctl is-active sandbench-worker@{name}").strip() == "active"
        log = sh(made, name, f"journalctl -u sandbench-worker@{name} --no-pager")
        assert f"{name}@{name} ready." in log and "Connected to redis://:**@lab-c:6379/0" in log
        assert "0::/" in sh(made, name, "cat /proc/self/cgroup")  # cgroup v2 unified
        env = sh(made, name, "stat -c '%a' /etc/sandbench/sandbench.env").strip()
        assert env == "600"
    hosts = sh(made, "lab-c", "sandbench hosts list")
    assert {line.split()[0] for line in hosts.splitlines()} == {"lab-a", "lab-b"}


def test_a_campaign_across_the_lab_verifies_and_leaves_nothing(
    lab: tuple[labmod.Lab, Fleet],
) -> None:
    made, _ = lab
    made.put("lab-c", "/root/lab.toml", PLAN)
    out = sh(made, "lab-c", "sandbench dispatch /root/lab.toml --hosts lab-a,lab-b")
    campaign = out.split("campaign:")[1].split()[0]
    # An environment's cgroup, read from inside lab-a during a round: in the unit's subtree.
    envs = UNIT_CGROUP.format("lab-a") + "/envs"
    seen = wait_until(
        lambda: sh(made, "lab-a", f"cd {shlex.quote(envs)} && for d in */; do "
                   "echo \"$d $(cat $d/memory.max) $(cat $d/cpuset.cpus)\"; done 2>/dev/null"
                   " | grep {campaign} || true".replace("{campaign}", campaign)).strip(),
        600, "an environment cgroup under sandbench-worker@lab-a.service/envs", interval=2,
    )  # fmt: skip
    key, memory_max, cpus = seen.splitlines()[0].split()
    assert key.startswith(f"{campaign}_lab-a_") and memory_max == str(2 << 30) and cpus == "0-1"

    def finalized() -> bool:
        status = sh(made, "lab-c", f"sandbench status {campaign}")
        return status.count("finalized") == 2

    wait_until(finalized, CAMPAIGN_TIMEOUT_S, f"{campaign} finalized on both hosts", interval=10)
    verdict = sh(made, "lab-c", f"sandbench verify {campaign}")
    assert f"campaign {campaign}: verified" in verdict
    sh(made, "lab-c", f"sandbench report {campaign}")
    data = f"/var/lib/sandbench/data/{campaign}"
    report = sh(made, "lab-c", f"cat {data}/report.md")
    assert "lab-a" in report and "lab-b" in report
    assert "fastest host" not in report.lower()  # (the report says it ranks none: "rank" is in it)
    # lab-b's clock is an hour ahead: its provenance says so, nothing else minds.
    dates = {
        name: json.loads(sh(made, "lab-c", f"cat {data}/hosts/{name}/provenance.json"))["date"]
        for name in ("lab-a", "lab-b")
    }
    skew = _seconds(dates["lab-b"]) - _seconds(dates["lab-a"])
    assert CLOCK_OFFSET_S - 900 < skew < CLOCK_OFFSET_S + 900, dates
    for name in ("lab-a", "lab-b"):
        assert_nothing_left(made, name)


def _seconds(stamp: str) -> float:
    """Seconds since the epoch of a provenance date (``YYYY-MM-DDTHH:MM:SSZ``)."""
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def assert_nothing_left(made: labmod.Lab, name: str) -> None:
    """No environment cgroup, process, mount or workspace left on host ``name``."""
    unit = UNIT_CGROUP.format(name)
    left = sh(made, name, f"find {shlex.quote(unit)}/envs -mindepth 1 -type d;"  # (its own files)
              " ls -A /var/tmp/sandbench/envs 2>/dev/null;"
              " grep -c /var/tmp/sandbench /proc/self/mountinfo || true")  # fmt: skip
    assert left.strip() == "0", left
    supervisor = sh(made, name, f"cat {shlex.quote(unit)}/supervisor/cgroup.procs").split()
    assert len(supervisor) >= 1  # the worker itself; no environment process anywhere else
    every = sh(made, name, f"find {shlex.quote(unit)} -name cgroup.procs | xargs cat").split()
    assert sorted(every) == sorted(supervisor), "a process outside the worker's own cgroup"


def test_lab_sh_refuses_a_second_lab_in_the_same_directory(lab: tuple[labmod.Lab, Fleet]) -> None:
    made, _ = lab
    with pytest.raises(labmod.LabError, match="a lab already exists"):
        labmod.up(made.dir, 1, labmod.DEFAULT_MEMORY_MIB, {})
    assert Path(made.dir / labmod.STATE_FILE).exists()
