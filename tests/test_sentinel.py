"""The machine-state sentinel: planned at the start, every K and at the end, run and signed in
both transports, in no cell (tables, results.csv, coverage, the rule), plotted in the report."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from test_campaign_local import Lab, _campaign_id

from contract.errors import PlanError
from contract.records import NOT_RUN_RULE, EnvironmentRecord
from coordinator.plan import sentinel
from coordinator.plan.campaign import describe, expand
from coordinator.plan.file import parse_plan
from coordinator.store.store import Store
from tests.fleet_helpers import dispatch, make_fleet, wait_finished, write_plan
from workloads.registry import WORKLOADS

__all__ = ["make_fleet"]

PLAN = """
name = "sentinel"
seed = 4
scale = 0.01
environments = 3
rounds = 1
limit_s = {limit}
workloads = ["stat-tree", "publish"]
modes = ["native", {{ name = "always-fails", template = ["/bin/false"] }}]
[sentinel]
every = {every}
"""
CALIBRATIONS = ["sentinel-cpu", "sentinel-fsync", "sentinel-meta", "sentinel-read"]
C = len(CALIBRATIONS)  # environments of one point


def sentinel_positions(kinds: list[str]) -> list[int]:
    """How many cell environments precede each sentinel point, from a run order of kinds."""
    out, cells = [], 0
    for i, kind in enumerate(kinds):
        if kind == "sentinel" and (i == 0 or kinds[i - 1] != "sentinel"):
            out.append(cells)
        cells += kind == "environment"
    return out


def test_points_at_start_every_k_and_end() -> None:
    """12 environments with K = 5: points before 0, 5 and 10 environments and after all 12,
    each the two calibrations in order, fixed work, native, numbered 0..3."""
    plan = parse_plan(PLAN.format(limit=90, every=5))
    specs = expand(plan, ["lab-a"], "c-1", "/w")
    assert [s.order_index for s in specs] == list(range(12 + 4 * C))
    assert sentinel_positions([s.kind for s in specs]) == [0, 5, 10, 12]
    marks = [s for s in specs if s.kind == "sentinel"]
    assert [(s.workload, s.env_index) for s in marks] == [
        (w, point) for point in range(4) for w in CALIBRATIONS
    ]
    for s in marks:
        assert (s.mode, s.mode_options, s.rounds, s.scale, s.seed) == ("native", {}, 3, 1.0, 0)
        assert s.limit_s == sentinel.LIMIT_S and s.attempt == 1 and s.quota == plan.quota.quota()
    assert len({s.task_id for s in specs}) == len(specs)
    line = next(x for x in describe(plan) if x.startswith("sentinel:"))
    assert line.startswith("sentinel: 4 points (start, every 5 environments, end)")
    assert set(CALIBRATIONS).isdisjoint(WORKLOADS)  # not among the 19


@pytest.mark.parametrize(
    ("setting", "points"),
    [("sentinel = false", 0), ("sentinel = true", 2), ("[sentinel]\nevery = 0", 0), ("", 2)],
)
def test_the_plan_turns_it_off_or_sets_k(setting: str, points: int) -> None:
    """sentinel = false (or every = 0) plans none; true or nothing plans the default K."""
    text = PLAN.format(limit=90, every=5).split("[sentinel]")[0] + setting + "\n"
    specs = expand(parse_plan(text), ["lab-a"], "c-1", "/w")
    assert sum(s.kind == "sentinel" for s in specs) == C * points
    assert sum(s.kind == "environment" for s in specs) == 12


def test_the_readmes_sentinel_settings_do_what_it_says() -> None:
    """The README's two sentinel blocks: the first plans no point, the second one every 50."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = [
        b for b in re.findall(r"```toml\n(.*?)```", readme, flags=re.DOTALL) if "sentinel" in b
    ]
    assert len(blocks) == 2
    base = PLAN.format(limit=90, every=5).split("[sentinel]")[0]
    off, every_50 = (parse_plan(base.replace("environments = 3", "environments = 40") + b)
                     for b in blocks)  # fmt: skip
    assert [s for s in expand(off, ["lab-a"], "c-1", "/w") if s.kind == "sentinel"] == []
    kinds = [s.kind for s in sorted(expand(every_50, ["lab-a"], "c-1", "/w"),
                                    key=lambda s: s.order_index)]  # fmt: skip
    assert sentinel_positions(kinds) == [0, 50, 100, 150, 160]  # 160 cell environments


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("sentinel = 30", "write sentinel = true, sentinel = false, or a table"),
        ("[sentinel]\nevery = -1", "sentinel.every = -1: Input should be greater than or equal"),
        ("[sentinel]\nevry = 3", "sentinel.evry"),
    ],
)
def test_a_bad_sentinel_setting_says_what_to_write(setting: str, message: str) -> None:
    """A sentinel value that is neither a boolean nor a table with ``every`` is refused."""
    text = PLAN.format(limit=90, every=5).split("[sentinel]")[0] + setting + "\n"
    with pytest.raises(PlanError, match=re.escape(message)):
        parse_plan(text, "p.toml")


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Lab, str, str]:
    """One `sandbench run` of the plan (K = 4) on this machine: the lab, campaign id, stdout."""
    lab = Lab(tmp_path_factory.mktemp("sentinel"))
    out = lab.sandbench("run", lab.plan(PLAN.format(limit=90, every=4)), *lab.run_args())
    return lab, _campaign_id(out.stdout), out.stdout


def _records(lab: Lab, cid: str) -> list[EnvironmentRecord]:
    return sorted(Store(lab.data).records(cid), key=lambda r: r.order_index)


def test_embedded_run_records_and_signs_the_sentinel(embedded: tuple[Lab, str, str]) -> None:
    """Every planned sentinel environment ran, passed, signed and verified, in its planned place
    (12 environments, K = 4: before 0, 4, 8 and after 12), its whole wall time recorded."""
    lab, cid, stdout = embedded
    records = _records(lab, cid)
    planned = Store(lab.data).load_campaign(cid).specs
    assert sorted(r.key() for r in records) == sorted(s.key() for s in planned)
    assert sentinel_positions([r.kind for r in records]) == [0, 4, 8, 12]
    marks = [r for r in records if r.kind == "sentinel"]
    assert len(marks) == 4 * C and all(r.outcome == "passed" and r.signature for r in marks)
    assert all(r.oracle and r.oracle.ok and len(r.rounds) == 3 for r in marks)
    assert all(r.wall_s and r.wall_s > sum(x.task_s for x in r.rounds) for r in marks)
    assert "records: verified" in stdout
    line = (
        f"host lab-test, cohort default: sentinel: {4 * C} of {4 * C} calibration "
        "environments (4 points), "
    )
    assert re.search(re.escape(line) + r"[\d.]+% of the environments' wall time \(", stdout)
    verify = lab.sandbench("verify", cid, "--data", str(lab.data), "--registry", str(lab.registry))
    assert f"({len(records)} records" in verify.stdout


def test_sentinel_is_in_no_table_nor_the_rule(embedded: tuple[Lab, str, str]) -> None:
    """A failing mode's cells fall under the rule; the sentinel points between them all ran;
    results.csv, the printed tables and the coverage know only the 12 cell environments."""
    lab, cid, stdout = embedded
    cells: dict[tuple[str, str], list[str]] = {}
    for r in _records(lab, cid):
        cells.setdefault((r.mode, r.workload), []).append(r.reason or r.outcome)
    assert cells[("always-fails", "publish")][1:] == [NOT_RUN_RULE] * 2
    assert cells[("native", "sentinel-cpu")] == ["passed"] * 4  # not a cell: every point ran
    rows = list(csv.DictReader(io.StringIO(
        (lab.data / cid / "hosts" / "lab-test" / "results.csv").read_text())))  # fmt: skip
    assert {r["workload"] for r in rows} == {"stat-tree", "publish"} and len(rows) == 4
    assert sum(int(r["planned"]) for r in rows) == 12
    assert "sentinel-" not in stdout.split("records: ")[0]  # the printed tables
    assert "coverage: planned 12, ran 8, passed 6, failed 2, not run (rule) 4" in stdout
    report = (lab.data / cid / "report.md").read_text()
    assert "| planned environments | 12 |" in report


def test_report_plots_the_sentinel_over_time(embedded: tuple[Lab, str, str]) -> None:
    """report.md and report.html carry the sentinel's section: its share of the time, a table
    per calibration and a figure with one point per sentinel environment."""
    lab, cid, _ = embedded
    report = (lab.data / cid / "report.md").read_text()
    section = report.split("### Machine-state sentinel", 1)[1].split("### Coverage", 1)[0]
    share = re.search(r"share of the environments' wall time: ([\d.]+)% \(", section)
    assert share and 0 < float(share.group(1)) < 100, section
    assert all(f"| {w} (ms) | 4 / 4 |" in section for w in CALIBRATIONS), section
    figure = (lab.data / cid / "plots" / "lab-test-default-sentinel.svg").read_text()
    points = re.findall(r"<path class='env' d='([^']*)'", figure)
    assert [p.count("h0") for p in points] == [4] * C  # one dot per point and calibration
    assert "time into the campaign" in figure and "task time / its median" in figure
    html = (lab.data / cid / "report.html").read_text()
    assert "Machine-state sentinel over the campaign" in html


def test_verify_counts_the_sentinel_for_completeness(embedded: tuple[Lab, str, str]) -> None:
    """A campaign whose last sentinel record is gone does not verify, naming that record."""
    lab, cid, _ = embedded
    path = lab.data / cid / "hosts" / "lab-test" / "records.jsonl"
    original = path.read_bytes()
    lines = original.decode().splitlines(keepends=True)
    last = max(range(len(lines)), key=lambda i: json.loads(lines[i])["order_index"])
    gone = json.loads(lines[last])
    assert gone["kind"] == "sentinel"
    try:
        path.write_text("".join(lines[:last] + lines[last + 1 :]))
        out = lab.sandbench("verify", cid, "--data", str(lab.data), "--registry",
                            str(lab.registry), check=1)  # fmt: skip
    finally:
        path.write_bytes(original)
    key = f"{cid}/lab-test/native/{gone['workload']}/{gone['env_index']}/1"
    assert key in out.stdout and "UNVERIFIED" in out.stdout, out.stdout


def test_failing_sentinel_points_all_run(tmp_path: Path) -> None:
    """With a limit nothing meets, every sentinel environment still runs and fails on its own:
    the rule skips none of them, and verify passes."""
    lab = Lab(tmp_path)
    out = lab.sandbench("run", lab.plan(PLAN.format(limit=0.001, every=6)), *lab.run_args())
    cid = _campaign_id(out.stdout)
    marks = [r for r in _records(lab, cid) if r.kind == "sentinel"]
    assert len(marks) == 3 * C and {(r.outcome, r.reason) for r in marks} == {("failed", "timeout")}
    assert "records: verified" in out.stdout


def test_fleet_dispatch_runs_the_sentinel(make_fleet: Any) -> None:
    """Dispatched to a lab host: the sentinel points run there in their places, signed by the
    host, stored, in no results row, the report shows them, and rerun refuses one (no cell)."""
    fleet = make_fleet(["lab-a"])
    fleet.register_hosts()
    fleet.start_worker("lab-a")
    fleet.start_coordinator()
    plan = write_plan(fleet.root / "plan.toml", sentinel={"every": 2})  # 4 environments
    campaign = dispatch(fleet, plan, "lab-a")
    wait_finished(fleet, campaign)
    store = Store(fleet.data)
    records = sorted(store.records(campaign, "lab-a"), key=lambda r: r.order_index)
    assert len(records) == 4 + 3 * C and sentinel_positions([r.kind for r in records]) == [0, 2, 4]
    marks = [r for r in records if r.kind == "sentinel"]
    assert all(r.outcome == "passed" and r.signature for r in marks)
    assert {r.signature.key_id for r in marks if r.signature} == {fleet.hosts["lab-a"].key.key_id}
    assert all(r.fleet["runner_end"] >= r.fleet["runner_start"] for r in marks)  # type: ignore[attr-defined]
    results = (fleet.data / campaign / "hosts" / "lab-a" / "results.csv").read_text()
    assert "sentinel-" not in results and "publish" in results
    report = (fleet.data / campaign / "report.md").read_text()
    assert "### Machine-state sentinel" in report and "| sentinel-cpu (ms) | 3 / 3 |" in report
    out = fleet.cli("rerun", str(marks[0].task_id), "--data", str(fleet.data))
    assert out.returncode == 2 and "is a sentinel environment, in no cell" in out.stderr, out
