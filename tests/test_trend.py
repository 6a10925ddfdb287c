"""Drift inside a campaign (coordinator.results.trend): the change figure, test and correction."""

from __future__ import annotations

import numpy as np
import pandas as pd

from coordinator.results.trend import MIN_N, cell_trends, holm, spearman_test, theil_sen


def frame(cells: dict[tuple[str, str], list[float]]) -> pd.DataFrame:
    """Environments of interleaved cells: cell k's i-th environment runs at order i * len + k."""
    rows = []
    for k, ((mode, workload), times) in enumerate(cells.items()):
        for i, t in enumerate(times):
            rows.append({"mode": mode, "workload": workload, "status": "passed",
                         "order_index": i * len(cells) + k, "task_s": t})  # fmt: skip
    return pd.DataFrame(rows)


def test_a_rising_cell_is_flagged_and_a_flat_one_is_not() -> None:
    """The issue's shape (about 30 ms rising to 75 ms over a campaign) is a significant drift of
    about +85% of the median; independent noise around a constant is not flagged."""
    rng = np.random.default_rng(1)
    rising = list(np.linspace(0.030, 0.075, 20) + rng.normal(0, 0.004, 20))
    flat = list(0.050 + rng.normal(0, 0.005, 20))
    found = {x.workload: x for x in cell_trends(frame({("native", "create-small"): rising,
                                                        ("native", "publish"): flat}))}  # fmt: skip
    assert found["create-small"].significant and 0.6 < found["create-small"].change < 1.1
    assert not found["publish"].significant and abs(found["publish"].change) < 0.3


def test_failed_environments_and_small_cells_are_not_tested() -> None:
    """Only passed environments count; a cell below MIN_N gets its change but no test."""
    env = frame({("native", "w"): [1.0, 2.0, 3.0]})
    env.loc[0, "status"] = "failed"
    (x,) = cell_trends(env)
    assert x.n == 2 and x.p is None and not x.significant and MIN_N > 2


def test_holm_corrects_over_the_cells() -> None:
    """p = 0.02 alone is significant; beside eleven other cells it is not (0.05 / 12)."""
    assert holm([0.02]) == [True]
    assert holm([0.02] + [0.5] * 11) == [False] * 12
    assert holm([0.001, 0.02, 0.5]) == [True, True, False]  # 0.001 < 0.05/3, 0.02 < 0.05/2


def test_the_figures_themselves() -> None:
    """Theil-Sen ignores an outlier; Spearman's rho of a monotone series is 1 with a small p."""
    x = np.arange(10, dtype=float)
    y = 2 * x + 1
    y[3] = 100.0
    assert theil_sen(x, y) == 2.0
    rho, p = spearman_test(x, x**2)
    assert rho == 1.0 and p < 0.001
