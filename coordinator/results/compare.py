"""Comparison of two result sets of one cohort, host by host and cell by cell.

A side is a whole campaign or one mode of a campaign (``ID:MODE``). Cells are matched per host:
by (mode, workload) between two campaigns, by workload between two modes. For each cell
complete on both sides: the two medians of the environment task time, their ratio B / A (below
1: B is faster) and, when both sides have N >= 10, the exact 95% Hodges-Lehmann interval of the
ratio (``ratio_interval``: rank-based, the ratios a two-sided Mann-Whitney test at 5% does not
reject) with a verdict; with fewer environments the ratio alone, marked exploratory. A cell
incomplete on either side, or present on one side only, is listed with why, never compared.

Refused (``CompareRefused``): two cohorts, no host in common, a host whose records the two
sides' keys signed differently (not the same machine), environments doing different work.

The machine's own shift between two campaigns is measured per host by the machine-state
sentinel (``coordinator.plan.sentinel``): the ratio B / A of each calibration workload's median, one
per resource (CPU, fsync, metadata, page-cache reads); the one farthest from 1 is the host's
``Drift`` as shown, and a cell's drift is the farthest of the resources its workload uses. A
faster/slower verdict is withheld (with why) when that drift goes the cell's way and
``|log drift| >= MASK_FRACTION * |log ratio|``: half of the cell's effect, or more, could be the
machine's (``sentinel.drift_masks``). Two modes of one
campaign share its time (the seeded order interleaves them), so they need no sentinel; two
campaigns without one say so.

Why that interval (2026-12-05, until then a percentile bootstrap of the ratio of the medians):
it is distribution-free and exact at any N, and at N = 10 it finds more of a change of every
environment's time. Over the README's twelve A/A pairs with an injected 20% effect it found 41
of 48 effect cells against the bootstrap's 35, with 19 false verdicts of 192 A/A cells against
17. What it does not see as well is a slowdown of only some environments (medians far apart,
ranks mixed); the ratio shown stays the ratio of the medians.

What the interval covers is stated (``interval_covers``): between two campaigns it compares
environments within each campaign, so it knows nothing of how two campaigns of one
configuration differ (``BETWEEN``, with the sound design for an A/B question); two modes of one
campaign are interleaved by its seeded order (``WITHIN``). That order is blocked by default
(``coordinator.plan.campaign.run_order``), so each side's environments are spread evenly over
the campaign, and they are still compared as two samples: the two-sample test stays valid
(conservative if anything) under that restricted randomization, and pairing the environments
of a block (a signed-rank interval) found fewer of the injected effects on this project's
machine (``benchmarks/aa.py``, the README's A/A figures of 2026-12-07). Given A/A campaigns
of the host (``--aa``: campaigns of one configuration, compared in consecutive pairs), the
interval between two campaigns adds the spread two campaigns showed there, per workload
(``WITH_AA``, ``coordinator.results.between``): over the README's twelve A/A pairs, each
judged with the spread of the other eleven, 3 of 192 A/A cells got a verdict instead of 19.

Each side's records are verified or not as ``report`` says (``coordinator.store.verdict``: the last
``verify``'s signed verdict over the bytes as they stand). Both sides' verdicts are stated; when
a side is not verified no cell gets a verdict (faster, slower, no difference): its ratio is
shown, marked ``unverified``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from contract.errors import CompareRefused
from coordinator.plan import sentinel
from coordinator.results import between
from coordinator.results.analysis import (
    CI_MIN_N,
    Analysis,
    HostTables,
    analyze_stored,
    flatten_facts,
    passed_values,
)
from coordinator.store.store import CAMPAIGN_FILE, Store
from coordinator.store.trust import HostRegistry
from coordinator.store.verdict import Verdict, verdict_of
from coordinator.store.views import CampaignView

FASTER, SLOWER = "faster", "slower"
SAME = "no significant difference"
EXPLORATORY = "exploratory"
WITHHELD = "withheld"
UNVERIFIED = "unverified"
WITHIN = ("both sides are modes of one campaign: the seeded order interleaves their "
          "environments (by default in blocks, one environment of every cell a block), so the "
          "interval covers the noise of this comparison")  # fmt: skip
BETWEEN = (
    "the interval ranks each side's environments within its own campaign: it covers "
    "within-campaign noise only, not how two campaigns of one configuration differ (the "
    "machine's state and drift between and during them; the sentinel catches part of it), so "
    "a verdict between two campaigns can be false (see the README's A/A figures). For an A/B "
    "question make both configurations modes of one plan and compare ID:A_MODE ID:B_MODE, or "
    "repeat campaigns on each side, or give compare A/A campaigns of the host (--aa)"
)
WITH_AA = (
    "between two campaigns the interval adds, per workload, the spread two campaigns of one "
    "configuration showed on the host: A/A campaigns {campaigns}, compared in consecutive "
    "pairs (coordinator/results/between.py); a cell whose workload they lack covers "
    "within-campaign noise only"
)
LEVEL = 0.95  # of the ratio's interval
EXACT_MAX = 400  # n + m up to which the interval's rank is exact (float64 holds C(400, 200))
SAME_WORK = ("scale", "rounds")  # plan fields that set what one environment does
NOTED_PLAN = ("environments", "limit_s", "quota", "vm", "seed")
NOTED_FACTS = ("cpu_model", "cores", "memory_bytes", "kernel", "os", "cgroup", "harness.commit",
               "work_root_fs.type", "tools.")  # fmt: skip


@dataclass(frozen=True)
class Drift:
    """The machine's own shift between the sides: a B / A ratio of calibration runs."""

    ratio: float
    source: str  # what measured it, for the message


@dataclass
class Side:
    """One side: a stored campaign, or one mode of it."""

    label: str
    campaign: CampaignView
    analysis: Analysis
    signers: dict[str, set[str]]  # host -> key ids that signed its records
    provenance: dict[str, dict[str, Any]]  # host -> provenance facts
    mode: str | None = None
    verdict: Verdict = Verdict(False, "not verified yet")  # noqa: RUF009 -- frozen: sharing it is safe

    def table(self, host: str, cohort: str) -> HostTables | None:
        """This side's tables of one host and cohort."""
        return next((t for t in self.analysis.tables if (t.host, t.cohort) == (host, cohort)), None)

    def cells(self, t: HostTables) -> dict[Any, Any]:
        """Cell key (workload with a mode, else (mode, workload)) -> its row, in table order."""
        rows = t.cells if self.mode is None else t.cells[t.cells["mode"] == self.mode]
        return {(r.workload if self.mode else (r.mode, r.workload)): r for r in rows.itertuples()}


@dataclass
class Cell:
    """One compared cell: medians (s), ratio B / A, its interval when N allows, a verdict."""

    host: str
    cohort: str
    workload: str
    mode_a: str
    mode_b: str
    n_a: int
    n_b: int
    median_a: float
    median_b: float
    ratio: float
    low: float | None
    high: float | None
    verdict: str
    why: str


@dataclass
class Excluded:
    """A cell listed but not compared, with why."""

    host: str
    cohort: str
    workload: str
    mode_a: str
    mode_b: str
    why: str


@dataclass
class Comparison:
    """Everything ``compare`` found: compared cells, excluded cells, notes."""

    a: str
    b: str
    cells: list[Cell] = field(default_factory=list)
    excluded: list[Excluded] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    drifts: dict[str, Drift] = field(default_factory=dict)  # host -> the machine's shift B / A
    sentinel: dict[str, list[sentinel.SentinelRatio]] = field(default_factory=dict)  # host ->
    no_sentinel: list[str] = field(default_factory=list)  # hosts with no sentinel on a side
    records_a: str = ""  # side A's records: "verified (...)" or why not
    records_b: str = ""
    no_verdict: str = ""  # why no cell has a verdict (a side's records are not verified)
    interval_covers: str = ""  # what the 95% intervals account for (WITHIN, BETWEEN, WITH_AA)
    aa_noise: dict[str, list[str]] = field(default_factory=dict)  # host -> "workload: spread"


def parse_side(text: str) -> tuple[str, str | None]:
    """``ID`` or ``ID:MODE`` -> (campaign id or directory, mode or None)."""
    ident, sep, mode = text.rpartition(":")
    if sep and mode and "/" not in mode:
        return ident, mode
    return text, None


def load_side(store: Store, text: str, registry: HostRegistry | None = None) -> Side:
    """The side named ``text`` (a campaign id in ``store`` or a campaign directory, ``:MODE``);
    ``registry`` says whose signed verdict on its records counts (default this machine's)."""
    ident, mode = parse_side(text)
    path = Path(ident)
    if (path / CAMPAIGN_FILE).is_file():  # a campaign directory, e.g. copied from another lab
        path = path.resolve()  # "." too: its name is the campaign id
        store, ident = Store(path.parent), path.name
    campaign = store.campaign_view(ident)
    analysis, records = analyze_stored(store, campaign)
    signers: dict[str, set[str]] = {}
    for r in records:
        if r.signature is not None:
            signers.setdefault(r.host, set()).add(r.signature.key_id)
    provenance = {t.host: store.provenance(ident, t.host) for t in analysis.tables}
    side = Side(text, campaign, analysis, signers, provenance, mode,
                verdict_of(store, ident, registry))  # fmt: skip
    modes = {str(m) for t in analysis.tables for m in t.cells["mode"]}
    if mode is not None and mode not in modes:
        raise CompareRefused(f"{text}: campaign {ident} has no mode '{mode}' "
                             f"(its modes: {', '.join(sorted(modes)) or 'none'})")  # fmt: skip
    return side


def verdict(n_a: int, n_b: int, ratio: float, interval: tuple[float, float] | None,
            drift: Drift | None = None) -> tuple[str, str]:  # fmt: skip
    """(verdict, why) of one cell; ``drift`` withholds faster/slower when it is as large."""
    if interval is None:
        why = f"N = {n_a} and {n_b}: ratio only (an interval needs N >= {CI_MIN_N})"
        if drift is not None and sentinel.drift_masks(drift.ratio, ratio):
            why += f"; the machine itself moved {drift.ratio:.3g}x ({drift.source})"
        return EXPLORATORY, why
    low, high = interval
    if low <= 1.0 <= high:
        return SAME, "the 95% interval of the ratio contains 1"
    word = FASTER if high < 1.0 else SLOWER
    if drift is not None and sentinel.drift_masks(drift.ratio, ratio):
        return WITHHELD, (f"B looks {word} ({ratio:.3g}x), but the machine itself moved "
                          f"{drift.ratio:.3g}x between A and B ({drift.source}), at least half "
                          "the effect")  # fmt: skip
    return word, f"the 95% interval of the ratio lies {'below' if word == FASTER else 'above'} 1"


def ratio_interval(a: np.ndarray, b: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """Exact Hodges-Lehmann interval of the ratio b / a: the k-th smallest and the k-th largest
    of the n x m ratios b_j / a_i, k the number of the Mann-Whitney statistic's values in its
    lower (1 - level) / 2 tail (24 for n = m = 10): the ratios r for which a two-sided test of
    "B is A times r" at 1 - level does not reject (Hollander and Wolfe, ch. 4)."""
    n, m = len(a), len(b)
    ratios = np.sort((np.log(b)[None, :] - np.log(a)[:, None]).ravel())
    k = u_tail(n, m, (1 - level) / 2)
    if k == 0:  # too few environments for an interval at this level
        return 0.0, math.inf
    return float(np.exp(ratios[k - 1])), float(np.exp(ratios[n * m - k]))


def u_tail(n: int, m: int, alpha: float) -> int:
    """How many of the values 0, 1, ... of the Mann-Whitney U statistic (n and m values, no
    ties) together have probability at most ``alpha`` under no difference. Exact (the Gaussian
    binomial coefficient [n + m, n] counts the orderings by U) while n + m <= EXACT_MAX, else
    the normal approximation."""
    if n + m > EXACT_MAX:
        sd = math.sqrt(n * m * (n + m + 1) / 12)
        return max(0, math.floor(n * m / 2 - NormalDist().inv_cdf(1 - alpha) * sd + 0.5))
    counts = np.zeros(n * m + 1)
    counts[0] = 1.0
    for i in range(1, min(n, m) + 1):  # times (1 - q^(max + i)), then over (1 - q^i)
        step = max(n, m) + i
        counts[step:] -= counts[:-step].copy()
        for r in range(i):
            counts[r::i] = np.cumsum(counts[r::i])
    tail = np.cumsum(counts) / math.comb(n + m, n)
    return int(np.searchsorted(tail, alpha * (1 + 1e-12), side="right"))


def compare(a: Side, b: Side, noise: between.Noise | None = None) -> Comparison:
    """Compare side ``b`` with side ``a`` under the study's rules (raises ``CompareRefused``);
    ``noise``, the host's between-campaign spreads from A/A campaigns (``aa_noise``), widens
    the intervals between two campaigns."""
    if (a.mode is None) != (b.mode is None):
        raise CompareRefused("name a mode on both sides (ID:MODE ID:MODE) or on neither")
    pairs = host_pairs(a, b)
    _check_same_work(a, b)
    out = Comparison(a.label, b.label, notes=_notes(a, b, pairs),
                     records_a=records_text(a), records_b=records_text(b))  # fmt: skip
    one = a.campaign.id == b.campaign.id
    if one and noise is not None:
        raise CompareRefused(
            f"{a.label} and {b.label} are modes of one campaign: the seeded order interleaves "
            "them, so there is no between-campaign noise to add; compare them without --aa"
        )
    out.interval_covers = WITHIN if one else BETWEEN
    if noise is not None:
        out.interval_covers = WITH_AA.format(campaigns=", ".join(noise.campaigns))
        out.notes += [f"{side.label} is one of the A/A campaigns: its difference from the others "
                      "counts as between-campaign noise, not as an effect"
                      for side in (a, b) if side.campaign.id in noise.campaigns]  # fmt: skip
        for (host, cohort, workload), spread in sorted(noise.spreads.items()):
            if (host, cohort) in pairs:
                out.aa_noise.setdefault(host, []).append(f"{workload}: {spread.text()}")
    for host, cohort in pairs:
        ta, tb = a.table(host, cohort), b.table(host, cohort)
        assert ta is not None
        assert tb is not None
        if not one:  # one campaign's modes share its time: no drift
            _measure_drift(out, a, b, host, cohort)
        _compare_host(out, (a, ta), (b, tb), noise)
    _refuse_unverified(out, a, b, noise.unverified if noise else [])
    return out


def aa_noise(campaigns: list[Side], a: Side) -> between.Noise:
    """The between-campaign spreads of A/A ``campaigns`` (whole campaigns of one configuration,
    at least two, doing the work of ``a``), compared in consecutive pairs."""
    if len(campaigns) < 2 or any(s.mode is not None for s in campaigns):
        raise CompareRefused(
            "--aa takes at least two campaign ids (whole campaigns, no :MODE) of one "
            "configuration run on the host, comma-separated; they are compared in consecutive "
            "pairs"
        )
    for side in campaigns:
        _check_same_work(a, side)
    for x, y in itertools.pairwise(campaigns):
        if x.campaign.id == y.campaign.id:
            raise CompareRefused(f"--aa names campaign {x.campaign.id} twice in a row: an A/A "
                                 "pair is two campaigns")  # fmt: skip
    pairs = [compare(x, y) for x, y in itertools.pairwise(campaigns)]
    unverified = [f"A/A pair {c.a} vs {c.b}: {c.no_verdict}" for c in pairs if c.no_verdict]
    return between.estimate([c.cells for c in pairs], [s.campaign.id for s in campaigns],
                            unverified)  # fmt: skip


def records_text(side: Side) -> str:
    """``verified (...)`` or ``unverified: why`` for one side's records."""
    return side.verdict.text if side.verdict.verified else f"unverified: {side.verdict.why}"


def _refuse_unverified(out: Comparison, a: Side, b: Side, aa: list[str]) -> None:
    """No verdict for any cell when a side's records, or an A/A campaign's (``aa``: why), are
    not verified: the ratio, marked."""
    unverified = [f"{name} ({s.label}) is {records_text(s)}"
                  for name, s in (("A", a), ("B", b)) if not s.verdict.verified]  # fmt: skip
    unverified += aa
    if not unverified:
        return
    why = out.no_verdict = "no verdict: " + "; ".join(unverified)
    for cell in out.cells:
        cell.verdict, cell.why = UNVERIFIED, f"{why} (the verdict would be: {cell.verdict})"


def _measure_drift(out: Comparison, a: Side, b: Side, host: str, cohort: str) -> None:
    """The host's sentinel ratios B / A and the drift they give (or that a side has none)."""
    found = sentinel.ratios(a.analysis.sentinel_of(host, cohort),
                            b.analysis.sentinel_of(host, cohort))  # fmt: skip
    worst = sentinel.largest(found)
    if worst is None:
        out.no_sentinel.append(host)
        return
    out.sentinel[host] = found
    source = f"sentinel {worst.workload}, medians of {worst.n_a} and {worst.n_b} points"
    out.drifts[host] = Drift(worst.ratio, source)


def host_pairs(a: Side, b: Side) -> list[tuple[str, str]]:
    """(host, cohort) present on both sides; refuses other cohorts, other hosts, other keys."""
    ka = {(t.host, t.cohort) for t in a.analysis.tables}
    kb = {(t.host, t.cohort) for t in b.analysis.tables}
    ca, cb = {c for _, c in ka}, {c for _, c in kb}
    if not ca & cb:
        raise CompareRefused(
            f"{a.label} is cohort {_names(ca)} and {b.label} cohort {_names(cb)}: results of "
            "two cohorts are never compared or pooled (the study's rule); compare campaigns "
            "of one cohort"
        )
    common = sorted(ka & kb)
    if not common:
        ha, hb = {h for h, _ in ka}, {h for h, _ in kb}
        raise CompareRefused(
            f"{a.label} ran on {_names(ha)} and {b.label} on {_names(hb)}: results of different "
            "hosts are never compared (the study's rule); compare two result sets of one host"
        )
    for host, _ in common:
        sa, sb = a.signers.get(host, set()), b.signers.get(host, set())
        if sa and sb and not sa & sb:
            raise CompareRefused(
                f"host {host} signed {a.label} with {_names(sa)} and {b.label} with "
                f"{_names(sb)}: not the same machine as far as the records show, and results "
                "of different hosts are never compared (the study's rule)"
            )
    return common


def _check_same_work(a: Side, b: Side) -> None:
    """Refuse sides whose environments do different work (a time ratio would mean nothing)."""
    for name in SAME_WORK:
        va, vb = a.campaign.plan.get(name), b.campaign.plan.get(name)
        if va != vb:
            raise CompareRefused(
                f"{a.label} has {name} {va} and {b.label} {name} {vb}: their environments do "
                "different work, so their task times are not compared; run both with one "
                f"{name}"
            )


def _compare_host(out: Comparison, a: tuple[Side, HostTables], b: tuple[Side, HostTables],
                  noise: between.Noise | None) -> None:  # fmt: skip
    """Append the compared and the excluded cells of one host and cohort."""
    (sa, ta), (sb, tb) = a, b
    ca, cb = sa.cells(ta), sb.cells(tb)
    va, vb = passed_values(ta, "task_s"), passed_values(tb, "task_s")
    for key in [*ca, *(k for k in cb if k not in ca)]:
        ra, rb = ca.get(key), cb.get(key)
        workload = key if isinstance(key, str) else key[1]
        ma = sa.mode or (key[0] if isinstance(key, tuple) else "")
        mb = sb.mode or ma
        why = _why_not(sa, ra, sb, rb)
        if why:
            out.excluded.append(Excluded(ta.host, ta.cohort, workload, ma, mb, why))
            continue
        xa, xb = va[(ma, workload)], vb[(mb, workload)]
        cell = _cell(ta, workload, (ma, xa), (mb, xb), drift_of(out, ta.host, workload),
                     noise)  # fmt: skip
        out.cells.append(cell)


def drift_of(out: Comparison, host: str, workload: str) -> Drift | None:
    """The machine's shift that bears on ``workload``: the farthest from 1 of the calibrations
    of the resources it uses (``sentinel.bearing_on``), None without a sentinel."""
    worst = sentinel.largest(sentinel.bearing_on(out.sentinel.get(host, []), workload))
    if worst is None:
        return None
    return Drift(worst.ratio, f"sentinel {worst.workload}, medians of {worst.n_a} and "
                              f"{worst.n_b} points")  # fmt: skip


def _cell(t: HostTables, workload: str, a: tuple[str, np.ndarray], b: tuple[str, np.ndarray],
          drift: Drift | None, noise: between.Noise | None) -> Cell:  # fmt: skip
    """One compared cell from the environment task times of both sides; ``noise`` widens its
    interval by the host's between-campaign spread for the workload."""
    (ma, xa), (mb, xb) = a, b
    med_a, med_b = float(np.median(xa)), float(np.median(xb))
    ratio = med_b / med_a
    interval = ratio_interval(xa, xb) if min(len(xa), len(xb)) >= CI_MIN_N else None
    spread = None if noise is None else noise.of(t.host, t.cohort, workload)
    if interval is not None and spread is not None and math.isfinite(interval[1]):
        interval = between.widen(*interval, spread)
    word, why = verdict(len(xa), len(xb), ratio, interval, drift)
    if noise is not None and interval is not None:
        why += (f"; widened by the A/A spread of {workload} on host {t.host}, {spread.text()}"
                if spread is not None else f"; no A/A estimate for {workload} on host "
                f"{t.host}: within-campaign noise only")  # fmt: skip
    low, high = interval or (None, None)
    return Cell(t.host, t.cohort, workload, ma, mb, len(xa), len(xb), med_a, med_b, ratio,
                low, high, word, why)  # fmt: skip


def _why_not(sa: Side, ra: Any, sb: Side, rb: Any) -> str:
    """Why a matched cell is not compared ('' when it is)."""
    if ra is None or rb is None:
        return f"only in {sa.label if rb is None else sb.label}"
    parts = [f"{s.label}: {r.status} ({r.reason})" for s, r in ((sa, ra), (sb, rb))
             if r.status != "complete"]  # fmt: skip
    if not parts and min(ra.task_s_median, rb.task_s_median) <= 0:
        parts.append("a median of zero has no ratio")
    return "; ".join(parts)


def _notes(a: Side, b: Side, pairs: list[tuple[str, str]]) -> list[str]:
    """What else differs: plan settings, host facts, hosts of one side only."""
    notes = []
    for name in NOTED_PLAN:
        va, vb = a.campaign.plan.get(name), b.campaign.plan.get(name)
        if va != vb:
            notes.append(f"plan {name}: {va} in {a.label}, {vb} in {b.label}")
    for host in sorted({h for h, _ in pairs}):
        fa = dict(flatten_facts(a.provenance.get(host, {})))
        fb = dict(flatten_facts(b.provenance.get(host, {})))
        for k in sorted(set(fa) | set(fb)):
            if k.startswith(NOTED_FACTS) and fa.get(k) != fb.get(k):
                notes.append(f"host {host} {k}: {fa.get(k, '—')} in {a.label}, "
                             f"{fb.get(k, '—')} in {b.label}")  # fmt: skip
    paired = set(pairs)
    for side in (a, b):
        for t in side.analysis.tables:
            if (t.host, t.cohort) not in paired:
                notes.append(f"host {t.host} (cohort {t.cohort}) only in {side.label}: "
                             "not compared")  # fmt: skip
    return notes


def _names(values: set[str]) -> str:
    return ", ".join(sorted(values)) or "nothing"
