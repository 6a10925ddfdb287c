"""Plan files and presets: validation messages, expansion, seeded order, plan show."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from contract.errors import PlanError
from coordinator.plan.campaign import describe, expand, host_rng, new_campaign_id
from coordinator.plan.file import (
    check_runs_here,
    format_cpus,
    load_plan,
    missing_cpus,
    parse_plan,
    preset,
)
from worker.modes import BUILTIN_MODES
from workloads.catalog import CALIBRATION
from workloads.registry import WORKLOADS

PLAN = """
name = "t"
seed = 7
environments = 2
workloads = ["workflow", "seq-write"]
modes = ["native", { name = "fake", template = ["/bin/true", "{payload_argv}"] }]
[quota]
memory = "1GiB"
swap = "512MiB"
"""


def test_plan_is_validated_and_normalized() -> None:
    """Groups resolve to names, sizes parse, command modes carry their template as options."""
    plan = parse_plan(PLAN)
    assert plan.quota.quota().memory_bytes == 1024**3 and plan.quota.swap == 512 * 1024**2
    cells = plan.cells()
    assert [w for m, w in cells if m.name == "native"] == [
        "seq-write", "repo-inspect", "incremental-build", "publish"]  # fmt: skip
    assert cells[-1][0].mode_options() == {
        "template": ["/bin/true", "{payload_argv}"],
        "staged": False,
    }
    assert plan.rounds == 3 and plan.limit_s == 90 and plan.vm.vcpus == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('modes = ["native"]\nworkloads = ["seqwrite"]',
         "workloads[0] 'seqwrite' is not a workload; did you mean 'seq-write'?"),
        ('modes = ["nativ"]', "modes[0] 'nativ' is not a mode; did you mean 'native'?"),
        ('modes = ["native"]\nenvironments = 0',
         "environments = 0: Input should be greater than or equal to 1"),
        ('modes = ["native"]\nenviroments = 3',
         "enviroments = 3: Extra inputs are not permitted"),
        ('workloads = ["all"]', "modes is missing"),
        ('modes = ["native"]\n[quota]\nmemory = "lots"', "quota.memory: 'lots' is not a size"),
        ('modes = ["native", "native"]', "modes[1] 'native' appears twice"),
        ("modes = [", "not valid TOML"),
        ('modes = ["native"]\nlimit_s = inf', "limit_s = inf: Input should be a finite number"),
        ('modes = ["native"]\nlimit_s = nan', "limit_s = nan: Input should be a finite number"),
        ('modes = ["native"]\nlimit_s = 1e9',
         "limit_s = 1000000000.0: Input should be less than or equal to 86400"),
        ('modes = ["native"]\nscale = nan', "scale = nan: Input should be a finite number"),
        ('modes = ["native"]\nrounds = 11',
         "rounds = 11: Input should be less than or equal to 10"),
        ('modes = ["native"]\nenvironments = 100000000',
         "environments = 100000000: Input should be less than or equal to 1000"),
        ('modes = ["native", "host", "staged"]\nenvironments = 1000',
         ("expands to 57,000 environments per host (57 cells x 1000 environments); at most "
         "50,000")),
        ('modes = ["native"]\n[quota]\ncpus = "banana"',
         "quota.cpus: 'banana' is not a CPU list; write e.g. \"0,1\" or \"0-3\""),
        ('modes = ["native"]\n[quota]\ncpus = "3-1"', "'3-1' is not a CPU range"),
        ('modes = ["native"]\n[quota]\ncpus = "0-99999999"', "'0-99999999' is not a CPU range"),
        ('modes = ["native"]\n[quota]\ncpus = "0"',
         'quota: cpu_quota 2 exceeds the 1 CPU of cpus "0"; give at most 1'),
        ('modes = ["native"]\n[quota]\ncpu_quota = inf',
         "quota.cpu_quota = inf: Input should be a finite number"),
        ('modes = ["native"]\n[quota]\nmemory = "2000000GiB"',
         "quota.memory: '2000000GiB' is more than 1 PiB"),
        ('modes = ["native"]\ncohort = "x/../../../ESCAPED"',
         "cohort: 'x/../../../ESCAPED' is not a usable name: use 1-64 letters, digits"),
        ('modes = [{ name = "../gv", template = ["runsc", "{payload_argv}"] }]',
         "modes[0].name: '../gv' is not a usable name"),
        ('modes = [{ name = "native", workloads = [] }]',
         "modes[0].workloads is empty; name a workload or drop the key"),
    ],
)  # fmt: skip
def test_plan_errors_name_the_key_and_the_fix(text: str, message: str) -> None:
    """Each mistake is reported with the file, the key and what to write instead."""
    with pytest.raises(PlanError) as err:
        parse_plan(text, "my.toml")
    assert str(err.value).startswith("my.toml: ") and message in str(err.value)


def test_seeded_order_is_reproducible_per_seed_and_host() -> None:
    """Same seed and host give the same order; another seed or host gives another."""
    plan = parse_plan(PLAN)

    def order(p: object, host: str = "lab-a") -> list[tuple[str, str, int]]:
        return [(s.mode, s.workload, s.env_index) for s in expand(p, [host], "c-1", "/w")]  # type: ignore[arg-type]

    first = order(plan)
    assert first == order(plan)
    assert first != order(plan.model_copy(update={"seed": 8}))
    assert first != order(plan, "lab-b")
    assert sorted(first) == sorted(order(plan.model_copy(update={"seed": 8})))
    specs = expand(plan, ["lab-a", "lab-b"], "c-1", "/w")
    lab_b = [s.order_index for s in specs if s.host == "lab-b"]
    points = 2 * len(CALIBRATION)  # two sentinel points, each every calibration once
    assert lab_b == list(range(16 + points))  # 16 environments and the sentinel
    assert len({s.task_id for s in specs}) == 2 * (16 + points)


def test_blocked_order_runs_environment_i_of_every_cell_in_block_i() -> None:
    """The default order: block i holds environment i of every cell, once each, shuffled within
    (not in one order for every block, nor the same on two hosts); ``order = "shuffled"`` is one
    shuffle of all, the order of campaigns planned before 2026-12-07 (its slots made cell by
    cell, then shuffled by the host's generator), which spreads a cell's environments
    unevenly."""
    plan = parse_plan(PLAN.replace("environments = 2", "environments = 6"))
    assert plan.order == "blocked"
    cells = plan.cells()

    def slots(p: object, host: str = "lab-a") -> list[tuple[str, str, int]]:
        specs = expand(p, [host], "c-1", "/w")  # type: ignore[arg-type]
        return [(s.mode, s.workload, s.env_index) for s in specs if s.workload not in CALIBRATION]

    blocked = slots(plan)
    size = len(cells)
    blocks = [blocked[k : k + size] for k in range(0, len(blocked), size)]
    assert len(blocks) == 6
    for i, block in enumerate(blocks):
        assert sorted(block) == sorted((e.name, w, i) for e, w in cells)
    assert len({tuple((m, w) for m, w, _ in block) for block in blocks}) > 1  # shuffled within
    assert blocked != slots(plan, "lab-b")
    shuffled_plan = parse_plan(PLAN.replace("seed = 7", 'seed = 7\norder = "shuffled"'))
    shuffled = slots(shuffled_plan)
    old = [(e.name, w, i) for e, w in shuffled_plan.cells() for i in range(2)]
    host_rng(7, "lab-a").shuffle(old)
    assert shuffled == old
    assert "seed 7 (shuffled order)" in describe(shuffled_plan)[0]
    assert "seed 7 (blocked order)" in describe(plan)[0]
    with pytest.raises(PlanError, match="order"):
        parse_plan(PLAN.replace("seed = 7", 'seed = 7\norder = "random"'))


def smoke_expansion() -> str:
    """The smoke preset's expansion line, counted from the registry (every built-in mode; the
    guest-booting ones with publish only)."""
    guests = sum(info.boots_guest for info in BUILTIN_MODES.values())
    others = len(BUILTIN_MODES) - guests
    total = (19 * others + guests) * 3
    return (
        f"expansion per host: 19 workloads x {others} modes x 3 environments + 1 workload x "
        f"{guests} modes x 3 environments = {total} environments"
    )


def test_presets_expand_as_documented() -> None:
    """smoke: 19 workloads in non-VM modes, publish in VM modes, said in its notes; full: all."""
    _, smoke = preset("smoke")
    per_mode = Counter(m.name for m, _ in smoke.cells())
    assert per_mode["native"] == per_mode["docker"] == per_mode["podman"] == len(WORKLOADS) == 19
    assert per_mode["vm"] == per_mode["vm-microvm"] == 1
    assert smoke.scale < 1 and any("VM modes run only: publish" in n for n in smoke.notes)
    assert smoke_expansion() in describe(smoke)
    _, reference = preset("reference")
    assert len(reference.cells()) * reference.environments == 19 * 9 * 3 == 513
    assert reference.scale == 1.0 and reference.cohort == "reference"
    assert (
        describe(reference)[-1]
        == "expansion per host: 19 workloads x 9 modes x 3 environments = 513 environments"
    )
    _, full = preset("full")
    n = len(BUILTIN_MODES)
    assert len(full.cells()) * full.environments == 19 * n * 3 and full.scale == 1.0
    assert describe(full)[-1] == (
        f"expansion per host: 19 workloads x {n} modes x 3 environments = {19 * n * 3} environments"
    )
    assert new_campaign_id().startswith("c-") and len(new_campaign_id()) == len("c-20261129-ab12")


def test_plan_show_command(tmp_path: Path) -> None:
    """`sandbench plan show` prints the expansion, and a bad plan exits 2 with the fix."""
    out = subprocess.run([sys.executable, "-m", "coordinator", "plan", "show", "--preset", "smoke"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 and smoke_expansion() in out.stdout
    assert "VM modes run only: publish" in out.stdout
    out = subprocess.run([sys.executable, "-m", "coordinator", "plan", "show", "--preset",
                          "reference"], capture_output=True, text=True, timeout=60)  # fmt: skip
    last = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 0
    assert last == "expansion per host: 19 workloads x 9 modes x 3 environments = 513 environments"
    bad = tmp_path / "bad.toml"
    bad.write_text('modes = ["dokcer"]\n')
    out = subprocess.run([sys.executable, "-m", "coordinator", "plan", "show", str(bad)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "did you mean 'docker'?" in out.stderr


def test_a_plan_that_is_not_utf8_names_the_byte(tmp_path: Path) -> None:
    """A Latin-1 plan is refused with the offending byte, its offset and its line."""
    data = b'modes = ["native"]\nname = "caf\xe9"\n'
    path = tmp_path / "latin1.toml"
    path.write_bytes(data)
    with pytest.raises(PlanError) as err:
        load_plan(path)
    offset = data.index(b"\xe9")
    assert str(err.value) == (
        f"{path}: not UTF-8: byte 0xe9 at offset {offset} (line 2); save the plan as UTF-8"
    )


def test_run_refuses_cpus_this_host_lacks() -> None:
    """A well-formed CPU list passes the plan check; running here needs every CPU of it."""
    plan = parse_plan('modes = ["native"]\n[quota]\ncpus = "0-8191"')
    missing = sorted(set(range(8192)) - os.sched_getaffinity(0))
    assert missing_cpus(plan) == missing
    with pytest.raises(PlanError, match=rf"names CPUs this host does not have \({missing[0]}-"):
        check_runs_here(plan, "big.toml")
    here = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    check_runs_here(parse_plan(f'modes = ["native"]\n[quota]\ncpus = "{here}"\ncpu_quota = 1'), "")
    assert format_cpus([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"


def test_values_at_the_bounds_and_declared_options_pass() -> None:
    """The least quota, memory and guest pass; a built-in mode takes the options it declares."""
    plan = parse_plan(
        'modes = [{ name = "vm", options = { accel = "tcg", guest_hold = false } }, '
        '{ name = "gvisor", options = { platform = "systrap" } }, '
        '{ name = "runsc-do", template = ["runsc", "do", "{payload_argv}"], staged = false }]\n'
        "limit_s = 90\nseed = 0\n"
        '[quota]\ncpu_quota = 0.01\nmemory = "64MiB"\nswap = 0\n[vm]\nvcpus = 1\nmemory_mib = 128'
    )
    assert plan.quota.cpu_quota == 0.01 and plan.quota.memory == 64 * 1024**2
    assert plan.limit_s == 90.0 and isinstance(plan.limit_s, float)
    assert plan.vm.size().memory_mib == 128
    assert [m.mode_options() for m in plan.mode_entries()][:2] == [
        {"accel": "tcg", "guest_hold": False}, {"platform": "systrap"}]  # fmt: skip
