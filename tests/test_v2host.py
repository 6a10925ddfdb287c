"""The cgroup v2 lab host for real: each group of checks runs in one boot of ops/v2-host.sh.

A group is an inner pytest file (``tests/v2guest_*.py``, not collected here) run inside the
guest; its JUnit report comes back over a shared directory and every inner test is relayed as
one test here, failing with the inner failure and its output. Boots under TCG cost ~10 s each;
the groups are sized so the whole set stays within a few minutes (README: Lab host requirements).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO, require
from worker.vm import guest, qemu

pytestmark = [pytest.mark.v2host, pytest.mark.vm, pytest.mark.slow]

V2HOST = REPO / "ops" / "v2-host.sh"
GROUPS = {"quota": "tests/v2guest_quota.py", "docker": "tests/v2guest_docker.py"}
GROUP_TIMEOUT_S = 1200.0  # a hung guest is stopped by ops/v2-host.sh --timeout
OUTPUT_TAIL = 6000
README_COMMAND = re.compile(
    r"^ops/v2-host\.sh \.venv/bin/sandbench env run .*--json$", re.MULTILINE
)


@dataclass
class Case:
    """One inner test's result from the guest's JUnit report."""

    outcome: str  # passed, failed, error, skipped
    message: str = ""
    output: str = ""


@dataclass
class GroupRun:
    """One boot of the v2 host running one group's inner file."""

    group: str
    status: int
    seconds: float
    output: str
    cases: dict[str, Case] = field(default_factory=dict)

    def check(self, name: str) -> None:
        """Fail (or, for an inner skip, require) as the inner test ``name`` and its cases did."""
        cases = {k: c for k, c in self.cases.items() if k == name or k.startswith(f"{name}[")}
        if not cases:
            pytest.fail(f"no result for {name} from the v2 host ({self.summary()})\n{self.tail()}")
        for key, case in cases.items():
            if case.outcome == "skipped":
                require(False, f"inside the v2 host, {key}: {case.message}")
            elif case.outcome != "passed":
                pytest.fail(f"inside the v2 host, {key} {case.outcome}: {case.message}\n"
                            f"{case.output[-OUTPUT_TAIL:]}", pytrace=False)  # fmt: skip

    def summary(self) -> str:
        """Status and time of the boot."""
        return f"group {self.group}: status {self.status} after {self.seconds:.0f} s"

    def tail(self) -> str:
        """The end of the boot's output."""
        return self.output[-OUTPUT_TAIL:]


def inner_tests(path: str) -> list[str]:
    """The test functions of an inner file, in file order."""
    tree = ast.parse((REPO / path).read_text())
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name[:5] == "test_"]


def require_v2host() -> None:
    """The v2 host can boot here: QEMU and the prepared guest with its v2 initramfs."""
    require(qemu.qemu_binary() is not None, "qemu-system-x86_64 (ops/setup.sh)")
    problem = guest.v2host_problem(guest.load_guest())
    require(problem is None, f"the v2 host's guest ({problem})")


def boot_group(group: str, shared: Path) -> GroupRun:
    """Boot the v2 host once, run the group's inner file in it, collect its JUnit report."""
    require_v2host()
    report = shared / f"{group}.xml"
    argv = [
        str(V2HOST), "--share", str(shared), "--timeout", str(GROUP_TIMEOUT_S),
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o",
        "junit_logging=all", f"--junitxml={report}", GROUPS[group],
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=GROUP_TIMEOUT_S + 120
    )
    run = GroupRun(group, proc.returncode, time.monotonic() - start, proc.stdout + proc.stderr)
    if report.exists():
        run.cases = parse_junit(report)
    return run


def parse_junit(report: Path) -> dict[str, Case]:
    """Inner test name (with parameters) -> its result."""
    cases = {}
    for case in ET.parse(report).iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "failed" if tag == "failure" else tag
                message = f"{node.get('message', '')}\n{node.text or ''}".strip()
                break
        output = "\n".join(n.text or "" for n in case if n.tag in ("system-out", "system-err"))
        cases[str(case.get("name"))] = Case(outcome, message, output)
    return cases


class Boots:
    """Each group's boot, run on first use and kept (one boot per group per session)."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.runs: dict[str, GroupRun] = {}

    def __getitem__(self, group: str) -> GroupRun:
        if group not in self.runs:
            self.runs[group] = boot_group(group, self.factory.mktemp(f"v2host-{group}"))
        return self.runs[group]


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boots]:
    """The boots of the groups, each printed with its cost at the end (-rA shows it)."""
    boots = Boots(tmp_path_factory)
    yield boots
    for run in boots.runs.values():
        print(f"\nv2 host {run.summary()}")


@pytest.mark.parametrize("name", inner_tests(GROUPS["quota"]))
def test_quota_inside_the_v2_host(groups: Boots, name: str) -> None:
    """The inner check ``name`` of tests/v2guest_quota.py passed in the v2 host (its docstring
    says which behaviour: quota, OOM, kill, placements, host check, worker refusal)."""
    groups["quota"].check(name)


@pytest.mark.parametrize("name", inner_tests(GROUPS["docker"]))
def test_docker_inside_the_v2_host(groups: Boots, name: str) -> None:
    """The inner check ``name`` of tests/v2guest_docker.py passed in the v2 host (its docstring
    says which behaviour: private dockerd, container limits and OOM, the small campaign)."""
    groups["docker"].check(name)


@pytest.mark.parametrize("group", list(GROUPS))
def test_each_group_ran_to_the_end(groups: Boots, group: str) -> None:
    """Every inner test of a group reported a result and the guest's pytest exited with 0."""
    run = groups[group]
    expected = set(inner_tests(GROUPS[group]))
    reported = {name.split("[")[0] for name in run.cases}
    assert reported == expected, f"{run.summary()}: missing {expected - reported}\n{run.tail()}"
    assert run.status == 0, f"{run.summary()}\n{run.tail()}"


def test_the_readme_command_prints_a_passed_v2_record() -> None:
    """The README's ops/v2-host.sh env run command prints a passed record saying cgroup v2."""
    require_v2host()
    match = README_COMMAND.search((REPO / "README.md").read_text())
    assert match, "the README shows ops/v2-host.sh .venv/bin/sandbench env run ... --json"
    proc = subprocess.run(
        shlex.split(match.group(0)), cwd=REPO, capture_output=True, text=True,
        timeout=GROUP_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-OUTPUT_TAIL:]
    record = json.loads(proc.stdout)
    assert record["outcome"] == "passed", (record["reason"], record["detail"])
    assert record["provenance"]["cgroup_version"] == 2
    assert record["provenance"]["cgroup"]["limits"]["memory.swap.max"] == "0"


def test_forced_kvm_fails_at_once_where_kvm_is_unusable() -> None:
    """ops/v2-host.sh --accel kvm where the KVM probe failed exits 2 at once with the probe's
    reason, never booting a guest that hangs."""
    require_v2host()
    from worker.vm import accel

    prepared = guest.load_guest()
    assert prepared is not None
    problem = accel.kvm_problem(prepared)
    if problem is None:  # KVM works here: forcing it is fine, and the probe's verdict uses it
        return
    start = time.monotonic()
    proc = subprocess.run([str(V2HOST), "--accel", "kvm", "true"], capture_output=True, text=True,
                          timeout=accel.KVM_PROBE_S + 60)  # fmt: skip
    assert proc.returncode == 2
    assert (
        "--accel kvm is forced but KVM is unusable here" in proc.stderr and problem in proc.stderr
    )
    assert time.monotonic() - start < accel.KVM_PROBE_S + 10
