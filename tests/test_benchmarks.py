"""Benchmark scripts run as written and report failures through their exit status."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, require, require_binary


def run_script(name: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``benchmarks/<name>`` with this interpreter; its completed process."""
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / name), *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, **env}, check=False,
    )  # fmt: skip


def test_workloads_native_passes() -> None:
    """workloads_native.py exits 0 when every environment passes."""
    done = run_script("workloads_native.py", "--scale", "0.02", "publish")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "match" in done.stdout


def test_workloads_native_fails_loudly() -> None:
    """workloads_native.py exits 1 and names the environment when one fails."""
    done = run_script(
        "workloads_native.py", "--scale", "0.02", "publish", SANDBENCH_PYTHON="/bin/false"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED environments: publish" in done.stdout


def test_fidelity_prints_its_figures() -> None:
    """fidelity.py runs both parts and prints ratios and Ready - spawn (targets are its verdict,
    not this test's: it exits 0 or 1 by them, never 2 here)."""
    done = run_script(
        "fidelity.py", "--pairs", "1", "--workflow-pairs", "2", "--ready", "2", "--scale", "0.02",
        "--workloads", "publish", "read-small", "--modes", "native", "command",
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout + done.stderr
    out = done.stdout
    assert "load average at start" in out and "load average at end" in out
    figures = r"\s+[\d.]+\s+[\d.]+\s+(?P<ratio>[\d.]+)\s+(?P<low>[\d.]+)-(?P<high>[\d.]+)$"
    publish = re.search(r"^publish\s+workflow" + figures, out, flags=re.MULTILINE)
    assert publish, out
    low, ratio, high = (float(publish[name]) for name in ("low", "ratio", "high"))
    assert low <= ratio <= high, out  # the interval holds the figure it qualifies
    assert re.search(r"^native\s+(-?[\d.]+\s+){5}", out + " ", flags=re.MULTILINE), out
    assert "mechanisms: median of 1 ratios" in out and "native: median Ready - spawn" in out


def test_fidelity_fails_without_figures() -> None:
    """fidelity.py exits 2, printing no figure, when an environment fails."""
    done = run_script(
        "fidelity.py", "--pairs", "1", "--scale", "0.02", "--workloads", "publish",
        "--modes", SANDBENCH_PYTHON="/bin/false",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "FAILED environment, no figure" in done.stdout


def test_fleet_soak_smoke_meets_its_targets() -> None:
    """fleet_soak.py, small: a worker killed, redis and the coordinator restarted, and every
    target met (nothing lost, stored twice or left behind; verify passes), exit 0."""
    require(os.geteuid() == 0, "root (network namespaces, cgroups, overlay mounts)")
    require_binary("redis-server")
    done = run_script(
        "fleet_soak.py", "--environments", "20", "--kill-every", "3", "4", "--max-kills", "1",
        "--hold-s", "1", "--bound-s", "300",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^lost\s+0\s+0$", done.stdout, flags=re.MULTILINE), done.stdout
    assert re.search(r"^leftover mounts\s+0\s+0$", done.stdout, flags=re.MULTILINE), done.stdout
    faults = r"faults: 1 worker kill -9 .*1 redis restart, 1 coordinator restart"
    assert re.search(faults, done.stdout), done.stdout


def test_fuzz_inputs_counts_what_it_tried() -> None:
    """fuzz_inputs.py with a few examples per property says how many it tried and failed, and
    exits 0 when none failed."""
    done = run_script("fuzz_inputs.py", "--examples", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "plan files (plan show, run): tried 3, failed 0" in done.stdout, done.stdout
    assert "damaged campaigns (verify, report, compare): tried 3, failed 0" in done.stdout


def test_campaign_wall_prints_its_figures() -> None:
    """campaign_wall.py runs sandbench run on an ext4 and a Btrfs work root and prints each
    campaign's wall time, measured share against its target, split and largest costs (the
    targets are its verdict at full scale, not this test's: exit 0 or 1, never 2)."""
    require(os.geteuid() == 0, "root (the Btrfs loop mount)")
    require_binary("mkfs.btrfs")
    done = run_script(
        "campaign_wall.py", "--configs", "full", "btrfs", "--n", "1", "--scale", "0.02",
        "--workloads", "publish", "seq-write", "--no-settle",  # no wait after a deletion
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout + done.stderr
    for config, target in (("full", 70), ("btrfs", 85)):
        figures = rf"^{config}\s+wall\s+[\d.]+ s\s+measured\s+[\d.]+%\s+"
        line = figures + rf"target >= {target}%: (met|MISSED)$"
        assert re.search(line, done.stdout, flags=re.MULTILINE), done.stdout
    assert done.stdout.count("largest unmeasured costs: ") == 2, done.stdout
    ahead = re.findall(r"preparation done ahead \(.*\) ([\d.]+) s$", done.stdout, re.MULTILINE)
    assert len(ahead) == 2 and all(float(s) > 0 for s in ahead), done.stdout


def test_aa_prints_its_figures(tmp_path: Path) -> None:
    """aa.py with one pair and the effect campaign, a busy neighbour beside them: two A/A
    campaigns and E compared, the rates printed beside their targets with their binomial
    intervals (the twins' 8 A/A cells, on which the exit status rests, are fewer than the 24
    its target asks for, so it says MISSED and exits 1: never 2 or a traceback); the
    neighbour's processes gone after."""
    require(os.geteuid() == 0, "root (cgroups)")
    done = run_script(
        "aa.py", "--pairs", "1", "--environments", "10", "--effect", "--neighbour",
        "--data", str(tmp_path / "data"), "--work-root", str(tmp_path / "work"),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "sentinel on, blocked order, a busy neighbour" in out.splitlines()[0], out
    neighbours = [p for p in Path("/proc").glob("[0-9]*/cmdline")
                  if b"every process follows the one schedule" in _read(p)]  # fmt: skip
    assert neighbours == [], neighbours
    assert re.search(r"^  sentinel B / A: sentinel-cpu [\d.]+x", out, flags=re.MULTILINE), out
    assert re.search(r"^  sentinel E / B: sentinel-cpu [\d.]+x", out, flags=re.MULTILINE), out
    assert len(re.findall(r"^  effect \S+: sleep [\d.]+ ms a round: ", out, re.MULTILINE)) == 4
    plain = out.split("compare A B (the interval covers within-campaign noise only):\n", 1)[1]
    false = r"^  A/A false verdicts: \d+ of 20 cells = [\d.]+% \(target <= 5% over >= 24 cells\): "
    assert re.match(false + "MISSED", plain), out
    assert re.search(r"the rate's 95% interval \[[\d.]+%, [\d.]+%\]", plain), out
    assert re.search(r"^  20% effect detected: \d+ of 4 cells = \d+% \(target >= 80%\): "
                     r"(met|MISSED) \(publish \d of 1, seq-write \d of 1, create-small \d of 1, "
                     r"repo-inspect \d of 1\)", plain, flags=re.MULTILINE), out  # fmt: skip
    assert "--aa" not in out  # one pair: no other pair to give the between-campaign spread
    inside = out.split("compare ID:twin-W ID:probe-W (two modes of one campaign", 1)[1]
    assert re.search(r"^  A/A false verdicts: \d+ of 8 cells = ", inside, re.MULTILINE), out
    assert re.search(r"^  20% effect detected: \d of 4 cells", inside, re.MULTILINE), out
    assert len(re.findall(r"^  effect \S+ inside 1e \(twin-\S+ vs probe-\S+\): ", out,
                          re.MULTILINE)) == 4, out  # fmt: skip
    exact = (
        r"^for scale, an exact 20% on the twins' A/A cells \(each probe's times x 1.20\): "
        r"slower in \d of 8 = \d+%: what N = 10 environments a side find in this noise, "
        r"however the effect is injected$"
    )
    assert re.search(exact, out, flags=re.MULTILINE), out
    paired = (  # a blocked campaign (the default): the same cells block by block, for scale
        r"^for scale, the same cells paired block by block \(a signed-rank interval of each "
        r"block's two environments; compare does not pair\): slower in \d of 8 = \d+%, and \d "
        r"false verdicts of the A/A cells$"
    )
    assert re.search(paired, out, flags=re.MULTILINE), out
    booted = (r"^for scale, the bootstrap of the medians \(compare's interval until 2026-12-05\) "
              r"on the same cells: A/A false verdicts \d+ of 20, withheld \d+; 20% effect "
              r"detected in \d+ of 4$")  # fmt: skip
    assert re.search(booted, out, flags=re.MULTILINE), out
    # 8 twin A/A cells: fewer than 24, so the design a verdict rests on misses (exit status 1)
    assert "targets MISSED by the twins inside one campaign (the exit status)" in out, out
    # the same campaigns read back (--stored): the same verdicts, nothing run
    ids = re.findall(r"^  1[abe]: (c-\S+) \(", out, flags=re.MULTILINE)
    assert len(ids) == 3, out
    again = run_script("aa.py", "--stored", ",".join(ids), "--data", str(tmp_path / "data"))
    assert again.returncode == 1, again.stdout + again.stderr
    figures = r"^ *(A/A false verdicts|20% effect detected|for scale).*$"
    assert re.findall(figures, again.stdout, re.MULTILINE) == re.findall(figures, out, re.MULTILINE)
    # read as two pairs, each is judged with the other's between-campaign spread (--aa): the
    # A/A cells' intervals only widen, so no more false verdicts than the plain interval gave
    twice = run_script("aa.py", "--stored", ",".join(ids), ",".join(ids), "--data",
                       str(tmp_path / "data"))  # fmt: skip
    spread = r"^  pair [12] judged with the spread of the other pairs: create-small [\d.]+%, "
    assert len(re.findall(spread, twice.stdout, re.MULTILINE)) == 2, twice.stdout
    counts = [int(n) for n in re.findall(r"^  A/A false verdicts: (\d+) of 40 ", twice.stdout,
                                         re.MULTILINE)]  # fmt: skip
    assert len(counts) == 2 and counts[1] <= counts[0], twice.stdout
    assert "compare A B --aa (the interval adds the other pairs' between-campaign spread):" in (
        twice.stdout
    )
    assert "(stored)" in again.stdout


def test_aa_pairs_a_block_with_the_exact_signed_rank_interval() -> None:
    """aa.py's block-by-block figure: the signed-rank tail counts of the published tables
    (two-sided 5%: T <= 0, 3, 8, 52, 137), none below six pairs; for ten pairs the interval is
    the 9th smallest and largest of the 55 Walsh averages of the log ratios; pairs with one
    ratio give that ratio."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import aa  # a script: importable with its folder on the path

    assert [aa.signed_rank_tail(n, 0.025) for n in (6, 8, 10, 20, 30)] == [1, 4, 9, 53, 138]
    assert aa.signed_rank_tail(5, 0.025) == 0
    assert aa.paired_interval(np.arange(1.0, 6.0), np.arange(1.0, 6.0)) == (0.0, math.inf)
    a = np.arange(1.0, 11.0)
    b = a * np.exp(np.linspace(-0.2, 0.4, 10))
    d = np.log(b / a)
    walsh = np.sort([(d[i] + d[j]) / 2 for i in range(10) for j in range(i, 10)])
    low, high = aa.paired_interval(a, b)
    assert (low, high) == pytest.approx((math.exp(walsh[8]), math.exp(walsh[46])))
    assert aa.paired_interval(a, 1.25 * a) == pytest.approx((1.25, 1.25))
    assert aa.binomial_interval(3, 48) == pytest.approx((0.01308, 0.17196), abs=1e-5)
    assert aa.binomial_interval(0, 48) == pytest.approx((0.0, 0.07397), abs=1e-5)


def _read(path: Path) -> bytes:
    """A file of /proc, or nothing when its process has gone meanwhile."""
    try:
        return path.read_bytes()
    except OSError:
        return b""
