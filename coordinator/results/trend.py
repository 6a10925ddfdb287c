"""Drift inside one campaign: does a cell's task time move with its place in the run order?

The seeded order spreads a drifting machine over every mode, so drift does not bias a
comparison of two modes of one campaign; it does widen every cell's spread, and between two
campaigns it is part of every ratio. This module measures it per cell from the environments'
task times against their ``order_index`` (the position in the host's run order):

* ``change``: the Theil-Sen slope (the median of the slopes between every two environments)
  times the cell's span of the run order, over the cell's median: how much the cell's time moved
  from its first environment to its last, as a fraction of its median (+0.5: 50% slower by the
  end). Robust to a few outliers, unlike a least-squares line.
* ``p``: a two-sided permutation test of Spearman's rank correlation between order and time
  (``PERMUTATIONS`` seeded shuffles; no distribution assumed).
* ``significant``: after Holm's correction over all cells of the host tested together, at
  ``ALPHA``: with a dozen cells, twelve uncorrected 5% tests would flag a cell in almost half of
  drift-free campaigns.

A cell needs ``MIN_N`` passed environments to be tested (fewer: its change alone, no test).

* ``machine``: what the machine-state sentinel (``coordinator.plan.sentinel``) did over the
  same span: for each calibration of a resource the cell's workload uses (``calibrations_for``),
  the same change figure from its points (Theil-Sen over its passed points, times the cell's
  span, over its median); the one farthest from none is kept, and ``explained`` says whether it
  went the cell's way by at least ``MASK_FRACTION`` of the cell's change in log terms, the rule
  ``compare`` withholds by (``drift_masks``). A CPU loop does not slow down for a file system's
  reasons: a cell that drifts with such a calibration drifted with the machine, not with what
  the harness left behind. It explains a trend; it does not remove it (the flag stays).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from coordinator.plan.sentinel import calibrations_for, drift_masks

ALPHA = 0.05
MIN_N = 6
PERMUTATIONS = 4000
SEED = 20261202
MIN_POINTS = 3  # passed sentinel points a calibration needs for its change over a span


@dataclass(frozen=True)
class Trend:
    """One cell's drift over the run order."""

    mode: str
    workload: str
    n: int
    change: float  # Theil-Sen slope x order span / median (fraction; + is slower later)
    rho: float  # Spearman's rank correlation of time with order
    p: float | None  # permutation p-value (None: too few environments to test)
    significant: bool = False  # after Holm's correction over the cells tested together
    # The sentinel's calibration (of a resource the workload uses) that changed most over the
    # cell's span, with that change (same figure as ``change``); None without a sentinel.
    machine: tuple[str, float] | None = None
    explained: bool = False  # ``machine`` went the same way by >= MASK_FRACTION of ``change``

    def machine_text(self) -> str:
        """``sentinel-cpu +30%``, or empty."""
        return "" if self.machine is None else f"{self.machine[0]} {self.machine[1]:+.0%}"


def theil_sen(x: np.ndarray, y: np.ndarray) -> float:
    """The median of the slopes between every two points with different ``x``."""
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    keep = dx != 0
    return float(np.median((y[j] - y[i])[keep] / dx[keep])) if keep.any() else 0.0


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank)."""
    return pd.Series(values).rank(method="average").to_numpy(dtype=float)


def spearman_test(x: np.ndarray, y: np.ndarray, seed: int = SEED) -> tuple[float, float]:
    """(rho, two-sided permutation p) of the rank correlation of ``y`` with ``x``."""
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    norm = float(np.sqrt((rx**2).sum() * (ry**2).sum()))
    if norm == 0:
        return 0.0, 1.0
    rho = float((rx * ry).sum() / norm)
    rng = np.random.default_rng(seed)
    shuffled = rng.permuted(np.tile(ry, (PERMUTATIONS, 1)), axis=1)
    null = shuffled @ rx / norm
    extreme = int((np.abs(null) >= abs(rho) - 1e-12).sum())
    return rho, (extreme + 1) / (PERMUTATIONS + 1)


def holm(pvalues: list[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down rejections, in the order given."""
    order = sorted(range(len(pvalues)), key=lambda k: pvalues[k])
    rejected = [False] * len(pvalues)
    for step, k in enumerate(order):
        if pvalues[k] > alpha / (len(pvalues) - step):
            break
        rejected[k] = True
    return rejected


def change_over(x: np.ndarray, y: np.ndarray, span: float) -> float:
    """Theil-Sen slope of ``y`` against ``x``, times ``span``, over ``y``'s median."""
    median = float(np.median(y)) if len(y) else 0.0
    return theil_sen(x, y) * span / median if median > 0 and len(x) > 1 else 0.0


Slopes = dict[str, tuple[float, float]]  # calibration -> (slope per place in the order, median)


def machine_slopes(points: pd.DataFrame | None) -> Slopes:
    """Each calibration's (Theil-Sen slope per place in the run order, median) from the
    sentinel's ``points`` (``SentinelTable.points``: workload, status, order_index, task_s);
    calibrations with fewer than ``MIN_POINTS`` passed points are left out."""
    if points is None or points.empty:
        return {}
    ok = points[points["status"] == "passed"].dropna(subset=["task_s"])
    found = {}
    for name, g in ok.groupby("workload", sort=False):
        x, y = g["order_index"].to_numpy(dtype=float), g["task_s"].to_numpy(dtype=float)
        median = float(np.median(y))
        if len(g) >= MIN_POINTS and median > 0:
            found[str(name)] = (theil_sen(x, y), median)
    return found


def _machine(
    workload: str, change: float, span: float, slopes: Slopes
) -> tuple[tuple[str, float] | None, bool]:
    """The bearing calibration that moved most over the cell's span, and whether it explains
    the cell's ``change`` (``drift_masks`` on 1 + each)."""
    bearing = [(name, slopes[name][0] * span / slopes[name][1])
               for name in calibrations_for(slopes, workload)]  # fmt: skip
    if not bearing:
        return None, False
    explains = [(name, m) for name, m in bearing if drift_masks(1 + m, 1 + change)]
    farthest = max(explains or bearing, key=lambda item: abs(np.log(max(1 + item[1], 1e-9))))
    return farthest, bool(explains)


def cell_trends(environments: pd.DataFrame, sentinel: pd.DataFrame | None = None) -> list[Trend]:
    """The trend of every cell of one host's ``environments`` (``HostTables.environments``:
    mode, workload, status, order_index, task_s), cells in the frame's order; with the host's
    sentinel points (``SentinelTable.points``), what the machine did over each cell's span."""
    ok = environments[environments["status"] == "passed"].dropna(subset=["task_s"])
    slopes = machine_slopes(sentinel)
    found: list[Trend] = []
    for (mode, workload), g in ok.groupby(["mode", "workload"], sort=False):
        x = g["order_index"].to_numpy(dtype=float)
        y = g["task_s"].to_numpy(dtype=float)
        span = float(x.max() - x.min()) if len(x) else 0.0
        change = change_over(x, y, span)
        if len(x) >= MIN_N:
            rho, p = spearman_test(x, y)
        else:
            rho, p = 0.0, None
        machine, explained = _machine(str(workload), change, span, slopes)
        found.append(Trend(str(mode), str(workload), len(y), change, rho, p,
                           machine=machine, explained=explained))  # fmt: skip
    tested = [k for k, t in enumerate(found) if t.p is not None]
    flags = holm([found[k].p for k in tested])  # type: ignore[misc]
    for k, flag in zip(tested, flags, strict=True):
        found[k] = replace(found[k], significant=flag)
    return found
