"""`sandbench compare A B` on real small campaigns: ratios, intervals, verdicts, refusals."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_campaign_local import Lab, _campaign_id

from coordinator.plan.sentinel import SentinelRatio, bearing_on, drift_masks, largest, resource_of
from coordinator.results import between
from coordinator.results.compare import (
    BETWEEN,
    EXPLORATORY,
    FASTER,
    SAME,
    SLOWER,
    WITHHELD,
    WITHIN,
    Cell,
    Drift,
    ratio_interval,
    u_tail,
    verdict,
)
from coordinator.store.store import Store
from worker import hostinfo
from workloads.catalog import CALIBRATION

SLOW_SYNC_S = 0.05  # the slow mode's sync sleeps this long inside every round's clock
PLAN = """
name = "{name}"
cohort = "{cohort}"
seed = 3
scale = {scale}
environments = {n}
rounds = 1
workloads = [{workloads}]
modes = {modes}
{extra}"""
NATIVE_AND_SLOW = (
    '["native", { name = "slow-sync", template = ["/usr/bin/env", "{payload_argv}"], '
    f'sync = ["sleep", "{SLOW_SYNC_S}"] }}]'
)
NATIVE_AND_FAILING = (
    '["native", { name = "slow-sync", template = ["/bin/false"] }, '
    '{ name = "extra", template = ["/usr/bin/env", "{payload_argv}"] }]'
)


class Campaigns:
    """One private lab and the ids of its campaigns, run once for this module."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.ids: dict[str, str] = {}

    def run(self, key: str, *, n: int = 1, modes: str = '["native"]', cohort: str = "default",
            scale: float = 0.01, host: str = "lab-test", home: str = "home",
            workload: str = "stat-tree", extra: str = "") -> None:  # fmt: skip
        """Run one campaign through `sandbench run` and remember its id under ``key``."""
        plan = self.lab.root / f"{key}.toml"
        plan.write_text(PLAN.format(name=key, cohort=cohort, scale=scale, n=n, modes=modes,
                                    workloads=json.dumps(workload), extra=extra))  # fmt: skip
        args = self.lab.run_args()
        args[args.index("--host-name") + 1] = host
        for flag, name in (("--key", "host.key"), ("--registry", "hosts.json")):
            args[args.index(flag) + 1] = str(self.lab.root / home / name)
        self.ids[key] = _campaign_id(self.lab.sandbench("run", str(plan), *args).stdout)

    def compare(self, a: str, b: str, *extra: str, check: int = 0) -> str:
        """Output of `sandbench compare` (sides named by key, ``key:mode`` for one mode), with
        the registry that trusts the coordinator key whose verdict `run` signed."""
        out = self.lab.sandbench("compare", self._side(a), self._side(b), "--data",
                                 str(self.lab.data), "--registry", str(self.lab.registry),
                                 *extra, check=check)  # fmt: skip
        return out.stdout + out.stderr

    def json(self, a: str, b: str) -> dict[str, Any]:
        """The comparison as JSON."""
        doc: dict[str, Any] = json.loads(self.compare(a, b, "--json"))
        return doc

    def _side(self, side: str) -> str:
        key, _, mode = side.partition(":")
        return self.ids[key] + (f":{mode}" if mode else "")


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory: pytest.TempPathFactory) -> Campaigns:
    """A (N=10, native + slow sync), B (the same plan again), C (N=3, a failing slow-sync)."""
    c = Campaigns(Lab(tmp_path_factory.mktemp("compare")))
    c.run("A", n=10, modes=NATIVE_AND_SLOW)
    c.run("B", n=10, modes=NATIVE_AND_SLOW)
    c.run("C", n=3, modes=NATIVE_AND_FAILING)
    return c


def _cell(doc: dict[str, Any], mode: str) -> dict[str, Any]:
    (cell,) = [x for x in doc["cells"] if x["mode_b"] == mode]
    return cell


def test_two_modes_of_one_campaign(campaigns: Campaigns) -> None:
    """A mode whose sync sleeps 50 ms per round is slower than native, interval above 1."""
    doc = campaigns.json("A:native", "A:slow-sync")
    cell = _cell(doc, "slow-sync")
    assert (cell["mode_a"], cell["n_a"], cell["n_b"]) == ("native", 10, 10)
    assert cell["median_b"] >= SLOW_SYNC_S > cell["median_a"]
    assert cell["ratio"] == pytest.approx(cell["median_b"] / cell["median_a"])
    assert 1 < cell["low"] <= cell["high"] and cell["verdict"] == SLOWER
    results = campaigns.lab.data / campaigns.ids["A"] / "hosts" / "lab-test" / "results.csv"
    rows = csv.DictReader(io.StringIO(results.read_text()))
    medians = {r["mode"]: float(r["task_s_median"]) for r in rows}
    assert cell["median_a"] == pytest.approx(medians["native"], abs=1e-6)  # as the report says
    assert cell["median_b"] == pytest.approx(medians["slow-sync"], abs=1e-6)
    assert doc["interval_covers"] == WITHIN  # interleaved by the seeded order
    report = (campaigns.lab.data / campaigns.ids["A"] / "report.md").read_text()
    drift = report.split("### Drift inside the campaign", 1)[1]
    assert re.match(r"\s+(No cell of the 2 tested drifts|\d of the 2 cells tested drift)", drift)
    assert "| workload | native | slow-sync |" in drift.split("###", 1)[0], drift[:600]
    journal = hostinfo.work_root_journal(campaigns.lab.work)  # the warning where it applies
    warned = "The work root is on ext4 without a journal" in drift.split("###", 1)[0]
    assert warned == (journal == hostinfo.NO_JOURNAL)
    same = _cell(campaigns.json("A:native", "A:native"), "native")
    assert same["ratio"] == 1.0 and same["low"] < 1 < same["high"] and same["verdict"] == SAME


def test_two_campaigns_cell_by_cell(campaigns: Campaigns) -> None:
    """Two runs of one plan: each cell's medians, ratio, interval and a verdict that fits it."""
    doc = campaigns.json("A", "B")
    assert [(x["mode_a"], x["workload"]) for x in doc["cells"]] == [
        ("native", "stat-tree"), ("slow-sync", "stat-tree")]  # fmt: skip
    (drift,) = doc["drifts"].values()
    ratios = [SentinelRatio(**r) for r in doc["sentinel"]["lab-test"]]
    for x in doc["cells"]:
        assert x["n_a"] == x["n_b"] == 10 and x["low"] <= x["high"]
        expected = SLOWER if x["low"] > 1 else FASTER if x["high"] < 1 else SAME
        bearing = largest(bearing_on(ratios, x["workload"]))  # its resources' farthest from 1
        assert bearing is not None
        if expected != SAME and drift_masks(bearing.ratio, x["ratio"]):
            expected = WITHHELD
        assert x["verdict"] == expected, x
    assert doc["excluded"] == [] and doc["no_sentinel"] == []
    assert doc["interval_covers"] == BETWEEN  # said plainly: within-campaign noise only
    found = doc["sentinel"]["lab-test"]
    assert [r["workload"] for r in found] == list(CALIBRATION)
    for r in found:  # the start and end points of each campaign
        assert r["n_a"] == r["n_b"] == 2 and r["ratio"] == pytest.approx(
            r["median_b"] / r["median_a"]
        )
    farthest = max(found, key=lambda r: abs(np.log(r["ratio"])))
    assert drift["ratio"] == farthest["ratio"] and farthest["workload"] in drift["source"]
    text = campaigns.compare("A", "B")
    assert "ratio = B / A" in text and "stat-tree" in text and "slow-sync" in text
    assert f"interval: {BETWEEN}" in text
    assert "sentinel B / A on host lab-test: sentinel-cpu " in text and "withheld when" in text
    assert "sentinel" not in campaigns.compare("A:native", "A:slow-sync")  # one campaign


def test_small_n_is_exploratory_and_incomplete_cells_are_listed(campaigns: Campaigns) -> None:
    """N=3 gives the ratio alone; a cell failed on one side or present on one side is listed."""
    doc = campaigns.json("A", "C")
    (cell,) = doc["cells"]
    assert (cell["mode_a"], cell["n_a"], cell["n_b"]) == ("native", 10, 3)
    assert cell["low"] is None and cell["high"] is None and cell["verdict"] == EXPLORATORY
    why = {x["mode_a"]: x["why"] for x in doc["excluded"]}
    assert why["slow-sync"].startswith(f"{campaigns.ids['C']}: incomplete (env 0 failed (startup/")
    assert why["extra"] == f"only in {campaigns.ids['C']}"
    assert any(n.startswith("plan environments: 10 in") for n in doc["notes"])
    rows = list(csv.DictReader(io.StringIO(campaigns.compare("A", "C", "--csv"))))
    verdicts = [(r["mode_a"], r["verdict"]) for r in rows]
    assert verdicts == [("native", EXPLORATORY), ("slow-sync", "not compared"),
                        ("extra", "not compared")]  # fmt: skip
    assert rows[1]["ratio"] == "" and rows[1]["median_a_s"] == ""  # listed, never compared
    text = campaigns.compare("A", "C")
    assert "exploratory: N < 10 on a side" in text and "not compared: slow-sync" in text


def test_refuses_other_cohorts_hosts_keys_and_work(campaigns: Campaigns) -> None:
    """Another cohort, host, host key or scale: exit 2 with a message that says why."""
    campaigns.run("night", cohort="night")
    campaigns.run("other-host", host="lab-other", home="home-other")
    campaigns.run("other-key", home="home-rekeyed")
    campaigns.run("other-scale", scale=0.02)
    refusals = {
        "night": "is cohort default and",
        "other-host": "ran on lab-test and",
        "other-key": "host lab-test signed",
        "other-scale": "has scale 0.01 and",
    }
    for key, message in refusals.items():
        out = campaigns.compare("A", key, check=2)
        assert message in out and "sandbench: error:" in out, out
    assert "never compared" in campaigns.compare("A", "night", check=2)
    out = campaigns.compare("A", "A:native", check=2)
    assert "name a mode on both sides" in out
    assert "has no mode 'vm'" in campaigns.compare("A:native", "A:vm", check=2)


def test_aa_campaigns_widen_the_interval_between_campaigns(campaigns: Campaigns) -> None:
    """``--aa A,B``: A and B are an A/A pair (one plan run twice), so compare A B with them
    widens each cell's interval by the spread they showed (the same cells: by exactly the
    estimate ``between.estimate`` gives from their own ratio and interval), states what the
    interval covers and the spread per workload, and judges the widened interval."""
    plain = campaigns.json("A", "B")
    both = f"{campaigns.ids['A']},{campaigns.ids['B']}"
    doc = json.loads(campaigns.compare("A", "B", "--json", "--aa", both))
    assert doc["interval_covers"].startswith("between two campaigns the interval adds, per "
                                             "workload, the spread"), doc  # fmt: skip
    assert campaigns.ids["A"] in doc["interval_covers"]
    (spreads,) = doc["aa_noise"].values()
    assert spreads[0].startswith("stat-tree: sd ") and "(2 cells of 1 pairs)" in spreads[0]
    se2 = [((math.log(x["high"]) - math.log(x["low"])) / (2 * between.Z)) ** 2
           for x in plain["cells"]]  # fmt: skip
    excess = sum(math.log(x["ratio"]) ** 2 for x in plain["cells"]) / 2 - sum(se2) / 2
    spread = between.Spread(math.sqrt(max(0.0, excess)), 2, 1)
    assert f"stat-tree: {spread.text()}" == spreads[0]
    ratios = [SentinelRatio(**r) for r in doc["sentinel"]["lab-test"]]
    for before, x in zip(plain["cells"], doc["cells"], strict=True):
        assert x["ratio"] == before["ratio"]
        low, high = between.widen(before["low"], before["high"], spread)
        assert (x["low"], x["high"]) == pytest.approx((low, high), rel=1e-9)
        assert x["low"] <= before["low"] and x["high"] >= before["high"]
        bearing = largest(bearing_on(ratios, x["workload"]))
        assert bearing is not None
        expected = verdict(10, 10, x["ratio"], (low, high), Drift(bearing.ratio, "sentinel"))[0]
        assert x["verdict"] == expected and "widened by the A/A spread of stat-tree" in x["why"]
    text = campaigns.compare("A", "B", "--aa", both)
    assert "A/A spread between campaigns on host lab-test: stat-tree: sd " in text, text
    for side in ("A", "B"):  # here both are: said, since a real B among them would hide it
        assert f"note: {campaigns.ids[side]} is one of the A/A campaigns" in text, text


def test_aa_refusals(campaigns: Campaigns) -> None:
    """--aa with one campaign, a campaign twice in a row, other work, or two modes of one
    campaign: exit 2 with what to give instead."""
    ids = campaigns.ids
    cases = {
        ids["A"]: "--aa takes at least two campaign ids",
        f"{ids['A']},{ids['A']}": "names campaign",
        f"{ids['A']}:native,{ids['B']}": "--aa takes at least two campaign ids",
        f"{ids['A']},no-such-campaign": "no-such-campaign",
    }
    for given, message in cases.items():
        out = campaigns.compare("A", "B", "--aa", given, check=2)
        assert message in out and "sandbench: error:" in out and "Traceback" not in out, out
    out = campaigns.compare("A:native", "A:slow-sync", "--aa", f"{ids['A']},{ids['B']}", check=2)
    assert "modes of one campaign" in out and "without --aa" in out, out


def test_between_estimate_and_widen_by_hand() -> None:
    """The spread: mean squared log ratio less mean squared standard error, per workload, at
    least 0; widening moves each log end out by sqrt(h^2 + (z sd)^2) - h, and no spread leaves
    the interval as it was."""

    def cell(workload: str, ratio: float, low: float, high: float) -> Cell:
        return Cell("h", "default", workload, "native", "native", 10, 10, 1.0, ratio, ratio,
                    low, high, SAME, "")  # fmt: skip

    wide = math.exp(2 * between.Z * 0.05)  # an interval whose se is 0.05
    pairs = [[cell("w", 1.2, 1.2 / math.sqrt(wide), 1.2 * math.sqrt(wide)),
              cell("v", 1.0, 0.5, 2.0)],
             [cell("w", 1 / 1.1, 0.8, 0.8 * wide), cell("w", 1.0, 0.0, math.inf)]]  # fmt: skip
    noise = between.estimate(pairs, ["x", "y", "z"])
    w = noise.of("h", "default", "w")
    assert w is not None and (w.cells, w.pairs) == (2, 2)  # the cell without an interval: out
    expected = (math.log(1.2) ** 2 + math.log(1.1) ** 2) / 2 - 0.05**2
    assert w.sd == pytest.approx(math.sqrt(expected))
    v = noise.of("h", "default", "v")
    assert v is not None and v.sd == 0.0  # within noise larger than the ratio: no spread
    assert between.widen(0.9, 1.2, v) == pytest.approx((0.9, 1.2))
    low, high = between.widen(0.9, 1.2, w)
    h = (math.log(1.2) - math.log(0.9)) / 2
    step = math.sqrt(h * h + (between.Z * w.sd) ** 2) - h
    assert (math.log(0.9) - math.log(low), math.log(high) - math.log(1.2)) == pytest.approx(
        (step, step)
    )
    assert noise.of("h", "default", "u") is None


def test_html_page_and_campaign_directory(campaigns: Campaigns, tmp_path: Path) -> None:
    """--html writes a self-contained page with table and figure; a copied directory is a side."""
    copy = tmp_path / "elsewhere" / campaigns.ids["B"]
    shutil.copytree(campaigns.lab.data / campaigns.ids["B"], copy)
    page = tmp_path / "compare.html"
    a, b = f"{campaigns.ids['A']}:native", f"{copy}:slow-sync"
    out = campaigns.lab.sandbench("compare", a, b, "--data", str(campaigns.lab.data),
                                  "--registry", str(campaigns.lab.registry),
                                  "--html", str(page))  # fmt: skip
    assert f"wrote {page}" in out.stdout
    text = page.read_text()
    assert "<table>" in text and "<svg" in text and "Ratio B / A: host lab-test" in text
    assert "<script" not in text and " src=" not in text and "<link" not in text
    assert ">slower<" in text


def test_each_side_states_its_verdict_and_an_unverified_side_gets_none(
    campaigns: Campaigns, tmp_path: Path
) -> None:
    """Both sides verified: each says so and the cells have verdicts. B copied with a record
    edited and its new SHA-256 written into verification.json: B is unverified (the verdict's
    signature), no cell gets a verdict, each ratio is still shown, marked unverified."""
    text = campaigns.compare("A:native", "A:slow-sync")
    assert "records of A: verified (" in text and "records of B: verified (" in text, text
    copy = tmp_path / "elsewhere" / campaigns.ids["B"]
    shutil.copytree(campaigns.lab.data / campaigns.ids["B"], copy)
    records = copy / "hosts" / "lab-test" / "records.jsonl"
    lines = records.read_bytes().splitlines()
    i = next(n for n, line in enumerate(lines) if b'"outcome":"passed"' in line)
    edited = re.sub(rb'"task_s":\d', b'"task_s":9', lines[i], count=1)
    assert edited != lines[i], lines[i]
    lines[i] = edited
    records.write_bytes(b"\n".join(lines) + b"\n")
    doc = json.loads((copy / "verification.json").read_bytes())
    doc["digests"]["hosts/lab-test/records.jsonl"] = hashlib.sha256(
        records.read_bytes()).hexdigest()  # fmt: skip
    (copy / "verification.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    out = campaigns.lab.sandbench("compare", campaigns.ids["A"], str(copy), "--data",
                                  str(campaigns.lab.data), "--registry",
                                  str(campaigns.lab.registry), "--json")  # fmt: skip
    result = json.loads(out.stdout)
    assert result["records_a"].startswith("verified ("), result["records_a"]
    assert result["records_b"].startswith("unverified: verification.json: bad coordinator "
                                          "signature"), result["records_b"]  # fmt: skip
    assert result["cells"] and all(x["verdict"] == "unverified" for x in result["cells"])
    for x in result["cells"]:
        assert x["ratio"] > 0 and f"B ({copy}) is unverified: verification.json" in x["why"], x
    shown = campaigns.lab.sandbench("compare", campaigns.ids["A"], str(copy), "--data",
                                    str(campaigns.lab.data), "--registry",
                                    str(campaigns.lab.registry)).stdout  # fmt: skip
    assert "records of B: unverified: verification.json: bad coordinator signature" in shown
    assert "unverified: no verdict: B (" in shown and SAME not in shown, shown
    assert not re.search(r"│ (faster|slower|withheld) +│", shown), shown


def test_a_campaign_without_sentinel_is_said_so(campaigns: Campaigns) -> None:
    """Against a campaign planned with sentinel = false, compare says no sentinel was measured."""
    campaigns.run("no-sentinel", n=10, modes=NATIVE_AND_SLOW, extra="sentinel = false\n")
    doc = campaigns.json("A", "no-sentinel")
    assert doc["no_sentinel"] == ["lab-test"] and doc["drifts"] == {} and doc["sentinel"] == {}
    text = campaigns.compare("A", "no-sentinel")
    assert "no machine-state sentinel measured on host lab-test" in text
    records = Store(campaigns.lab.data).records(campaigns.ids["no-sentinel"])
    assert len(records) == 20 and {r.kind for r in records} == {"environment"}


@contextmanager
def cpu_burners(count: int, cpu: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` busy-looping processes on CPU ``cpu``, killed (and reaped) at the end."""
    burn = [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile 1: pass"]
    procs = [subprocess.Popen(burn) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_busy_machine_withholds_the_verdict(campaigns: Campaigns) -> None:
    """B run while CPU burners compete: its sentinel and its cell both slow down, so compare
    prints the sentinel ratio and withholds "slower", saying the machine itself moved."""
    # Both on CPU 0 alone, B with three burners there: about a quarter of the CPU it had, an
    # effect no other load of a shared machine hides. Scale 0.5: rounds long enough (about 8 ms)
    # that every environment of B meets the burners (at 0.1 a few slipped between their slices:
    # medians 1.62x apart, yet the rank interval began at 0.99). A sentinel point every 2
    # environments: 6 a side, so each side's sentinel median does not hang on two points.
    cpu = min(os.sched_getaffinity(0))
    extra = f'[quota]\ncpus = "{cpu}"\ncpu_quota = 1.0\n[sentinel]\nevery = 2\n'
    plan = {"n": 10, "workload": "read-large", "scale": 0.5, "extra": extra}
    campaigns.run("calm", **plan)  # type: ignore[arg-type]
    with cpu_burners(3, cpu):
        campaigns.run("busy", **plan)  # type: ignore[arg-type]
    doc = campaigns.json("calm", "busy")
    drift = doc["drifts"]["lab-test"]
    (cell,) = doc["cells"]
    assert cell["workload"] == "read-large" and cell["ratio"] > 1.2 and cell["low"] > 1, cell
    assert drift["ratio"] > 1.2 and drift_masks(drift["ratio"], cell["ratio"]), (drift, cell)
    assert cell["verdict"] == WITHHELD and "the machine itself moved" in cell["why"], cell
    assert "B looks slower" in cell["why"]
    text = campaigns.compare("calm", "busy")
    assert "sentinel B / A on host lab-test" in text and WITHHELD in text


def test_verdict_rule_and_drift() -> None:
    """Faster/slower need an interval clear of 1; a machine drift the same way and at least half
    the cell's (in log terms) withholds them."""
    assert verdict(3, 10, 0.5, None)[0] == EXPLORATORY
    assert verdict(10, 10, 0.8, (0.7, 1.05))[0] == SAME
    assert verdict(10, 10, 0.8, (0.7, 0.9))[0] == FASTER
    assert verdict(10, 10, 1.3, (1.1, 1.4))[0] == SLOWER
    word, why = verdict(10, 10, 0.8, (0.7, 0.9), Drift(0.75, "sentinel"))
    assert word == WITHHELD and "machine itself moved 0.75x" in why and "faster" in why
    assert verdict(10, 10, 0.8, (0.7, 0.9), Drift(0.95, "sentinel"))[0] == FASTER
    # the rule: withheld once the machine moved at least half the cell's move (in log terms)
    assert verdict(10, 10, 0.64, (0.6, 0.7), Drift(0.79, "sentinel"))[0] == WITHHELD
    assert verdict(10, 10, 0.64, (0.6, 0.7), Drift(0.81, "sentinel"))[0] == FASTER
    assert verdict(10, 10, 1.5625, (1.5, 1.7), Drift(1 / 0.79, "sentinel"))[0] == WITHHELD
    assert verdict(10, 10, 1.5625, (1.5, 1.7), Drift(1 / 0.81, "sentinel"))[0] == SLOWER
    # a machine that moved the other way only hides part of the effect: the verdict stands
    assert verdict(10, 10, 1.5625, (1.5, 1.7), Drift(0.5, "sentinel"))[0] == SLOWER
    assert "machine itself moved" in verdict(3, 3, 0.64, None, Drift(0.79, "sentinel"))[1]


def test_ratio_interval_is_the_exact_rank_interval() -> None:
    """The Mann-Whitney tail counts of the published tables (two-sided 5%: U <= 2, 13, 23, 29,
    127), none below four values a side; equal samples give an interval around 1; for ten a
    side the interval is the 24th smallest and largest of the 100 ratios; the normal
    approximation beyond EXACT_MAX is within one of the exact count where they meet."""
    pairs = ((5, 5), (8, 8), (10, 10), (10, 12), (20, 20))
    assert [u_tail(n, m, 0.025) for n, m in pairs] == [3, 14, 24, 30, 128]
    assert u_tail(3, 3, 0.025) == 0
    assert ratio_interval(np.arange(1.0, 4.0), np.arange(1.0, 4.0)) == (0.0, math.inf)
    x = np.arange(1.0, 13.0)
    low, high = ratio_interval(x, x)
    assert low < 1 < high
    a, b = np.arange(1.0, 11.0), np.arange(1.0, 11.0) * 1.5
    ratios = np.sort((b[None, :] / a[:, None]).ravel())
    assert ratio_interval(a, b) == pytest.approx((ratios[23], ratios[76]))
    exact = u_tail(200, 200, 0.025)  # n + m = EXACT_MAX: the last exact count
    normal = 200 * 200 / 2 - 1.959964 * math.sqrt(200 * 200 * 401 / 12) + 0.5
    assert abs(exact - math.floor(normal)) <= 1
    assert abs(u_tail(201, 199, 0.025) - exact) <= 1


def test_ratio_interval_covers_95_percent() -> None:
    """Seeded draws of two samples of ten from one log-normal time: the interval contains 1 in
    at least 95% of them (its exact level is 95.7%), and a 1.4x change (1.7 standard deviations
    of the log time) is found in about 93% (a t-test's power there: 95%)."""
    rng = np.random.default_rng(5)
    draws = [(rng.lognormal(0, 0.2, 10), rng.lognormal(0, 0.2, 10)) for _ in range(1000)]
    covered = sum(low <= 1 <= high for low, high in (ratio_interval(a, b) for a, b in draws))
    assert 950 <= covered <= 980
    found = sum(ratio_interval(a, 1.4 * b)[0] > 1 for a, b in draws)
    assert found >= 900


def test_a_drift_withholds_only_the_workloads_that_use_its_resource() -> None:
    """The sentinel measures each resource; a metadata drift bears on create-small (files in new
    directories) but not on seq-write (one file, fsync), a CPU drift on every workload, and a
    workload this version does not know on every calibration (the conservative reading)."""
    found = [SentinelRatio(w, 3, 3, 0.01, 0.01 * r, r) for w, r in
             (("sentinel-cpu", 1.02), ("sentinel-fsync", 0.99), ("sentinel-meta", 1.6),
              ("sentinel-read", 1.01))]  # fmt: skip
    assert {resource_of(r.workload) for r in found} == {"cpu", "fsync", "metadata", "read"}
    assert largest(bearing_on(found, "create-small")).workload == "sentinel-meta"  # type: ignore[union-attr]
    assert largest(bearing_on(found, "seq-write")).workload == "sentinel-cpu"  # type: ignore[union-attr]
    assert bearing_on(found, "not-a-workload-here") == found
    assert bearing_on(found[1:2], "stat-tree") == found[1:2]  # none of its resources measured
    meta, cpu = Drift(1.6, "sentinel-meta"), Drift(1.02, "sentinel-cpu")
    assert verdict(10, 10, 1.5, (1.3, 1.7), meta)[0] == WITHHELD  # create-small's view
    assert verdict(10, 10, 1.5, (1.3, 1.7), cpu)[0] == SLOWER  # seq-write's view
