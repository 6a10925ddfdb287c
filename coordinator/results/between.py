"""Between-campaign noise of a host, from A/A campaigns: what a verdict between two campaigns
must clear beyond the noise inside each.

Two campaigns of one configuration on one host differ by more than their environments vary
within each campaign (the README's A/A figures: on this virtual machine a whole campaign can run
a few percent faster than the one before, in every cell, while the sentinel stays level).
``compare``'s interval ranks each side's environments within its own campaign, so between two
campaigns it is too narrow by that much. Given campaigns of one configuration already run on the
host, compared in consecutive pairs (the A/A pairs), this estimates for each (host, cohort,
workload) how much a between-campaign ratio spreads beyond the within-campaign noise:

    log r = (campaign effect of B - campaign effect of A) + within-campaign noise
    sd_b^2 = mean(log(r)^2) - mean(se^2), at least 0

over the A/A pairs' compared cells of that workload (its modes pooled), ``se`` each cell's
standard error as its 95% interval gives it (half its log width / 1.96). ``sd_b^2`` is the
variance that the difference of two campaigns' effects adds to any ratio between two campaigns
of that host, so ``compare --aa`` widens each cell's log interval to the half-width
``sqrt(h^2 + (1.96 sd_b)^2)`` (``widen``), keeping its asymmetry, and judges that interval.
A random-effects estimate, no more: with few A/A pairs it is itself noisy (the count of cells is
shown with it); cells whose workload has no estimate keep the within-campaign interval and say so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Protocol

Z = NormalDist().inv_cdf(0.975)  # the intervals are 95% ones


class Ratio(Protocol):
    """One compared cell as this module reads it (``compare.Cell`` is one)."""

    host: str
    cohort: str
    workload: str
    ratio: float
    low: float | None
    high: float | None


@dataclass(frozen=True)
class Spread:
    """One workload's between-campaign spread on one host: the sd of log(ratio) that two
    campaigns' own effects add, and what it was estimated from."""

    sd: float
    cells: int
    pairs: int

    def text(self) -> str:
        """``sd 4.2% (12 cells of 3 pairs)``: the spread as a relative change."""
        return f"sd {math.expm1(self.sd):.1%} ({self.cells} cells of {self.pairs} pairs)"


@dataclass
class Noise:
    """The A/A campaigns' between-campaign spreads, per (host, cohort, workload)."""

    campaigns: list[str]  # the A/A campaigns' ids, in the order given
    spreads: dict[tuple[str, str, str], Spread] = field(default_factory=dict)
    unverified: list[str] = field(default_factory=list)  # "X is unverified: why"

    def of(self, host: str, cohort: str, workload: str) -> Spread | None:
        """The spread that bears on one cell, None without an estimate."""
        return self.spreads.get((host, cohort, workload))


def estimate(pairs: Sequence[Sequence[Ratio]], campaigns: list[str],
             unverified: Sequence[str] = ()) -> Noise:  # fmt: skip
    """The spreads from the compared cells of A/A pairs (each pair two campaigns of one
    configuration): per (host, cohort, workload), over the cells with an interval;
    ``unverified``, why a pair's records are not verified (no verdict may rest on them)."""
    terms: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    seen: dict[tuple[str, str, str], set[int]] = {}
    for i, cells in enumerate(pairs):
        for x in cells:
            if x.low is None or x.high is None or not math.isfinite(x.high) or x.low <= 0:
                continue  # no interval (N < 10): no standard error to subtract
            se = (math.log(x.high) - math.log(x.low)) / (2 * Z)
            key = (x.host, x.cohort, x.workload)
            terms.setdefault(key, []).append((math.log(x.ratio) ** 2, se**2))
            seen.setdefault(key, set()).add(i)
    spreads = {}
    for key, found in terms.items():
        excess = sum(r2 for r2, _ in found) / len(found) - sum(s2 for _, s2 in found) / len(found)
        spreads[key] = Spread(math.sqrt(max(0.0, excess)), len(found), len(seen[key]))
    return Noise(campaigns, spreads, list(unverified))


def widen(low: float, high: float, spread: Spread) -> tuple[float, float]:
    """The 95% interval [low, high] of a ratio between two campaigns, widened by the spread two
    campaigns' own effects add: each log end moved out by ``sqrt(h^2 + (Z sd)^2) - h``, ``h``
    the interval's log half-width."""
    h = (math.log(high) - math.log(low)) / 2
    step = math.sqrt(h * h + (Z * spread.sd) ** 2) - h
    return low * math.exp(-step), high * math.exp(step)
