"""Bad plans are refused up front: plan show, run and dispatch exit 2, one line, nothing made."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.fleet_helpers import PYTHON, make_fleet

pytestmark = pytest.mark.fleet
__all__ = ["make_fleet"]  # the fixture

BASE = 'workloads = ["publish"]\nscale = 0.02\nenvironments = 1\nrounds = 1\n'
# The list of plans that once passed `plan show` and failed later, or crashed.
BAD_PLANS: dict[str, tuple[bytes, str]] = {
    "infinite-limit": (b'modes = ["native"]\nlimit_s = inf\n', "limit_s = inf"),
    "eleven-rounds": (b'modes = ["native"]\nrounds = 11\n', "rounds = 11"),
    "banana-cpus": (b'modes = ["native"]\n[quota]\ncpus = "banana"\n', "'banana' is not a CPU"),
    "huge-expansion": (b'modes = ["native"]\nenvironments = 100000000\n', "= 100000000"),
    "latin-1": (b'modes = ["native"]\nname = "caf\xe9"\n', "not UTF-8: byte 0xe9 at offset"),
    "escaping-cohort": (b'modes = ["native"]\ncohort = "x/../../../ESCAPED"\n', "usable name"),
    "unknown-mode": (b'modes = ["dokcer"]\n', "did you mean 'docker'?"),
    "unknown-workload": (b'modes = ["native"]\nworkloads = ["seqwrite"]\n', "'seq-write'?"),
    # Issue 22: names unique and honest.
    "command-mode-named-native": (
        b'modes = [{ name = "native", template = ["/bin/true", "{payload_argv}"] }]\n',
        (
            "under the name of the built-in mode 'native' (its records would pass for that "
            "mode's); rename it: did you mean 'true'?"
        ),
    ),
    "command-mode-twice": (
        (
            b'modes = [{ name = "rt", template = ["/bin/true", "{payload_argv}"] },\n'
            b'         { name = "rt", template = ["/bin/env", "{payload_argv}"] }]\n'
        ),
        "modes[1] 'rt' appears twice (first as modes[0]); rename it: did you mean 'env'?",
    ),
    # Issue 22: strict values, with bounds.
    "boolean-environments": (
        b'modes = ["native"]\nenvironments = true\n',
        "environments = true: Input should be a valid integer; write a number, not true or false",
    ),
    "quoted-scale": (
        b'modes = ["native"]\nscale = "0.02"\n',
        'scale = "0.02": Input should be a valid number; write it without quotes: 0.02',
    ),
    "quoted-limit": (b'modes = ["native"]\nlimit_s = "90"\n', "write it without quotes: 90"),
    "negative-seed": (b'modes = ["native"]\nseed = -1\n', "seed = -1: Input should be greater"),
    "options-on-native": (
        b'modes = [{ name = "native", options = { accel = "kvm" } }]\n',
        "modes[0] 'native': options.accel is not an option of this mode (it takes none)",
    ),
    "vm-option-typo": (
        b'modes = [{ name = "vm", options = { acel = "tcg" } }]\n',
        "options.acel is not an option of this mode; did you mean 'accel'? (it takes accel,",
    ),
    "staged-on-native": (
        b'modes = [{ name = "native", staged = true }]\n',
        "modes[0] 'native': staged is a command mode's key, and a built-in mode takes none",
    ),
    "clamped-cpu-quota": (
        b'modes = ["native"]\n[quota]\ncpu_quota = 1e-9\n',
        (
            "quota: cpu_quota 1e-09 is below 0.01 core, the least the cgroup enforces (1000 us per "
            '100000 us period: a smaller quota is raised to it); give 0.01 to 2 for cpus "0,1"'
        ),
    ),
    "float-memory": (b'modes = ["native"]\n[quota]\nmemory = 2.5\n', "memory = 2.5: not a size"),
    "list-memory": (b'modes = ["native"]\n[quota]\nmemory = [2]\n', "a list is not a size"),
    "table-swap": (b'modes = ["native"]\n[quota]\nswap = { a = 1 }\n', "a table is not a size"),
    "one-byte-memory": (
        b'modes = ["native"]\n[quota]\nmemory = 1\n',
        "quota.memory: 1 B is below 64 MiB, the least memory an environment gets",
    ),
    "boolean-memory": (b'modes = ["native"]\n[quota]\nmemory = true\n', "memory = true: not a"),
    "huge-vcpus": (b'modes = ["native"]\n[vm]\nvcpus = 100000\n', "vm.vcpus = 100000: Input"),
    "tiny-guest": (b'modes = ["native"]\n[vm]\nmemory_mib = 1\n', "vm.memory_mib = 1: Input"),
}


def _plan(tmp_path: Path, name: str) -> tuple[Path, str]:
    """The bad plan ``name`` written to a file (the base keys first, unless it overrides them)."""
    body, message = BAD_PLANS[name]
    lines = [ln for ln in BASE.splitlines() if ln.split(" =")[0].encode() not in body]
    path = tmp_path / f"{name}.toml"
    path.write_bytes("\n".join(lines).encode() + b"\n" + body)
    return path, message


def _sandbench(
    tmp_path: Path, *args: str, broker: str = "redis://127.0.0.1:1/0"
) -> subprocess.CompletedProcess[str]:
    """``sandbench ARGS`` with a private home, as an operator would run it."""
    env = {**os.environ, "SANDBENCH_HOME": str(tmp_path / "home"), "SANDBENCH_BROKER": broker}
    return subprocess.run([PYTHON, "-m", "coordinator", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _refused(out: subprocess.CompletedProcess[str], message: str, plan: Path) -> None:
    """Exit 2 and one line on stderr naming the plan file and the problem; nothing on stdout."""
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.startswith(f"sandbench: error: {plan}: "), out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("name", sorted(BAD_PLANS))
def test_bad_plan_is_refused_by_show_run_and_dispatch(
    name: str, tmp_path: Path, make_fleet: Any
) -> None:
    """plan show, run and dispatch refuse it alike; no campaign directory, no broker message."""
    plan, message = _plan(tmp_path, name)
    fleet = make_fleet(["lab-a"])
    data = tmp_path / "data"
    _refused(_sandbench(tmp_path, "plan", "show", str(plan)), message, plan)
    _refused(_sandbench(tmp_path, "run", str(plan), "--data", str(data)), message, plan)
    out = _sandbench(tmp_path, "dispatch", str(plan), "--hosts", "lab-a", "--data", str(data),
                     broker=fleet.redis.url())  # fmt: skip
    _refused(out, message, plan)
    assert not data.exists() and not (tmp_path / "home").exists()
    client = fleet.redis.client()
    try:
        assert client.dbsize() == 0, client.keys("*")
    finally:
        client.close()


def test_run_refuses_cpus_this_host_lacks_but_show_notes_them(tmp_path: Path) -> None:
    """A CPU list this host lacks: plan show passes with a note, run exits 2 creating nothing."""
    plan = tmp_path / "wide.toml"
    plan.write_text(BASE + 'modes = ["native"]\n[quota]\ncpus = "0-8191"\n')
    out = _sandbench(tmp_path, "plan", "show", str(plan))
    assert out.returncode == 0 and "note: this host lacks CPUs" in out.stdout, out.stderr
    data = tmp_path / "data"
    out = _sandbench(tmp_path, "run", str(plan), "--data", str(data))
    _refused(out, 'quota.cpus "0-8191" names CPUs this host does not have', plan)
    assert not data.exists() and not (tmp_path / "home").exists()
