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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

ALPHA = 0.05
MIN_N = 6
PERMUTATIONS = 4000
SEED = 20261202


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


def cell_trends(environments: pd.DataFrame) -> list[Trend]:
    """The trend of every cell of one host's ``environments`` (``HostTables.environments``:
    mode, workload, status, order_index, task_s), cells in the frame's order."""
    ok = environments[environments["status"] == "passed"].dropna(subset=["task_s"])
    found: list[Trend] = []
    for (mode, workload), g in ok.groupby(["mode", "workload"], sort=False):
        x = g["order_index"].to_numpy(dtype=float)
        y = g["task_s"].to_numpy(dtype=float)
        median = float(np.median(y)) if len(y) else 0.0
        span = float(x.max() - x.min()) if len(x) else 0.0
        change = theil_sen(x, y) * span / median if median > 0 and len(x) > 1 else 0.0
        if len(x) >= MIN_N:
            rho, p = spearman_test(x, y)
        else:
            rho, p = 0.0, None
        found.append(Trend(str(mode), str(workload), len(y), change, rho, p))
    tested = [k for k, t in enumerate(found) if t.p is not None]
    flags = holm([found[k].p for k in tested])  # type: ignore[misc]
    for k, flag in zip(tested, flags, strict=True):
        t = found[k]
        found[k] = Trend(t.mode, t.workload, t.n, t.change, t.rho, t.p, flag)
    return found
