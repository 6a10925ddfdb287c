"""Names are not paths: one pattern for campaign ids, cohorts, hosts, modes and workloads."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from contract.errors import InvalidName
from contract.names import NAME_RULE, check_name, is_name
from contract.records import EnvironmentRecord, EnvironmentSpec, RoundRecord
from contract.signing import HostKey
from coordinator.plan.campaign import expand, new_campaign_id
from coordinator.plan.file import parse_plan
from coordinator.store.store import Store
from tests.conftest import REPO
from tests.fleet_helpers import PYTHON
from worker.cgroups import cgroup_name
from worker.modes import BUILTIN_MODES
from workloads.registry import WORKLOADS

BAD_NAMES = ["", ".", "..", "x/y", "../x", ".hidden", "-rf", "a b", "a\nb", "café", "x" * 65]


def test_every_name_the_project_makes_is_valid() -> None:
    """Workloads, built-in modes, campaign ids, the default cohort and host names all match."""
    names = [*WORKLOADS, *BUILTIN_MODES, new_campaign_id(), "adhoc-20261201-101010", "default"]
    names += ["lab-a", "lab-a.example.org", "x" * 64]
    assert [n for n in names if not is_name(n)] == []


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_name_that_could_be_a_path_is_refused(name: str) -> None:
    """check_name and the wire models refuse it, and the message states the rule."""
    with pytest.raises(InvalidName) as err:
        check_name(name, "host")
    assert str(err.value) == f"host {name!r} is not a usable name: use {NAME_RULE}"
    with pytest.raises(ValidationError, match="is not a usable name"):
        EnvironmentSpec(campaign="c-1", host=name, mode="native", workload="publish",
                        env_index=0, work_root="/w")  # fmt: skip


def test_store_paths_take_names_only(tmp_path: Path) -> None:
    """Campaign and host directories refuse non-names; stray directories are not campaigns."""
    store = Store(tmp_path)
    with pytest.raises(InvalidName, match=re.escape("campaign id '../x'")):
        store.campaign_dir("../x")
    with pytest.raises(InvalidName, match=re.escape("host '../../x'")):
        store.host_dir("c-1", "../../x")
    (tmp_path / "not a campaign").mkdir()
    (tmp_path / "not a campaign" / "campaign.json").write_text("{}")
    assert store.campaign_ids() == []


def test_cgroup_names_hold_only_name_characters() -> None:
    """An environment's cgroup name is its key with '/' replaced, plus a random suffix."""
    spec = EnvironmentSpec(campaign="c-1", host="lab-a", mode="native", workload="publish",
                           env_index=0, work_root="/w")  # fmt: skip
    name = cgroup_name(spec.key())
    assert name.startswith("c-1_lab-a_native_publish_0_1-") and is_name(name[:64])


def test_a_stored_cohort_that_is_a_path_writes_no_report(tmp_path: Path) -> None:
    """A campaign stored with a cohort that climbs out of the store: `report` exits 2, no file."""
    data = tmp_path / "store" / "data"
    store = Store(data)
    plan = parse_plan('modes = ["native"]\nworkloads = ["publish"]\nenvironments = 1\nrounds = 1'
                      "\nsentinel = false")  # fmt: skip
    spec = expand(plan, ["lab-a"], "c-20261201-abcd", "/w")[0]
    store.create_campaign("", plan, [spec])
    record = EnvironmentRecord.from_spec(
        spec, outcome="passed", ready_ms=1.0, rounds=[RoundRecord(k=1, task_s=0.1, validated=True)]
    )
    store.append_record(record)
    path = store.campaign_dir(spec.campaign) / "campaign.json"
    text = path.read_text().replace('"cohort": "default"', '"cohort": "x/../../../ESCAPED"')
    path.write_text(text)
    line = store.records_path(spec.campaign, "lab-a")
    line.write_text(line.read_text().replace('"cohort":"default"', '"cohort":"x/../../../ESCAPED"'))
    out = _sandbench("report", spec.campaign, "--data", str(data))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "cohort 'x/../../../ESCAPED' is not a usable name" in out.stderr
    assert not [p for p in tmp_path.rglob("*") if "ESCAPED" in p.name]


def test_command_line_edges_refuse_path_names(tmp_path: Path) -> None:
    """hosts add, host init, worker, dispatch, report and env run: exit 2, nothing made."""
    key = HostKey.generate("lab-a").public_b64()
    registry, home, data = tmp_path / "hosts.json", tmp_path / "home", tmp_path / "data"
    plan = tmp_path / "plan.toml"
    plan.write_text('modes = ["native"]\nworkloads = ["publish"]\n')
    cases = [
        (["hosts", "add", "../x", key, "--registry", str(registry)], "host '../x'"),
        (["host", "init", "--name", "../x", "--home", str(home)], "--name '../x'"),
        (["worker", "--host", "../x"], "--host '../x'"),
        (["dispatch", str(plan), "--hosts", "lab-a,../b", "--data", str(data)], "'../b'"),
        (["report", "../x", "--data", str(data)], "campaign id '../x'"),
        (["env", "run", "--mode", "../x", "--template", "true", "--workload", "publish"],
         "--mode '../x'"),
    ]  # fmt: skip
    for args, message in cases:
        out = _sandbench(*args, home=home)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert out.stderr.startswith("sandbench: error: ") and message in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not registry.exists() and not data.exists() and not list(home.glob("*"))


def _sandbench(*args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``sandbench ARGS`` as a subprocess with a private home and no broker."""
    env = {"PATH": "/usr/sbin:/usr/bin:/bin", "SANDBENCH_HOME": str(home or "/nonexistent"),
           "SANDBENCH_BROKER": "redis://127.0.0.1:1/0"}  # fmt: skip
    return subprocess.run([PYTHON, "-m", "coordinator", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
