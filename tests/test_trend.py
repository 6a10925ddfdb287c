"""Drift inside a campaign (coordinator.results.trend): the change figure, test and correction."""

from __future__ import annotations

import numpy as np
import pandas as pd

from coordinator.plan.sentinel import SentinelTable
from coordinator.results.analysis import HostTables
from coordinator.results.report import trend_blocks
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


def sentinel(calibrations: dict[str, list[float]], every: int) -> pd.DataFrame:
    """Sentinel points: point p of each calibration at order p * every."""
    rows = [{"workload": name, "status": "passed", "order_index": p * every, "task_s": t}
            for name, times in calibrations.items() for p, t in enumerate(times)]  # fmt: skip
    return pd.DataFrame(rows)


LEVEL = [0.010, 0.0101, 0.0099, 0.010, 0.0102]  # a calibration that stays where it is
META_RISES = [0.010, 0.0115, 0.0125, 0.014, 0.015]  # +50% over the campaign


def two_rising_cells() -> pd.DataFrame:
    """native create-small (uses metadata) and seq-write (does not), both +50% over 20."""
    rng = np.random.default_rng(2)
    rising = list(np.linspace(0.040, 0.060, 20) + rng.normal(0, 0.002, 20))
    return frame({("native", "create-small"): rising, ("native", "seq-write"): rising})


def meta_rising() -> pd.DataFrame:
    """Sentinel points with sentinel-meta rising as the two cells do, CPU and fsync level."""
    return sentinel(
        {"sentinel-cpu": LEVEL, "sentinel-fsync": LEVEL, "sentinel-meta": META_RISES}, 10
    )


def test_a_drift_the_sentinel_shares_is_explained_and_one_it_does_not_is_not() -> None:
    """Two cells rise +50% over the campaign. With sentinel-meta rising as much, create-small
    (which uses metadata) moved with the host and seq-write (which does not) did not; with a
    level sentinel neither is explained. Both stay flagged either way."""
    env = two_rising_cells()
    found = {x.workload: x for x in cell_trends(env, meta_rising())}
    small, seq = found["create-small"], found["seq-write"]
    assert small.significant and seq.significant
    assert small.explained and small.machine is not None and small.machine[0] == "sentinel-meta"
    assert 0.3 < small.machine[1] < 0.7, small.machine
    assert not seq.explained and seq.machine is not None and seq.machine[0] != "sentinel-meta"
    flat = sentinel({"sentinel-cpu": LEVEL, "sentinel-fsync": LEVEL, "sentinel-meta": LEVEL}, 10)
    assert not any(x.explained for x in cell_trends(env, flat))
    assert all(x.machine is None and not x.explained for x in cell_trends(env))


def test_a_sentinel_moving_the_other_way_or_too_little_explains_nothing() -> None:
    """The machine getting faster, or slower by a tenth of the cell's change, is not it."""
    rng = np.random.default_rng(3)
    env = frame({("native", "create-small"): list(np.linspace(0.040, 0.080, 20)
                                                  + rng.normal(0, 0.002, 20))})  # fmt: skip
    for meta in ([0.014, 0.013, 0.012, 0.011, 0.010], [0.0100, 0.0102, 0.0104, 0.0106, 0.0108]):
        (x,) = cell_trends(env, sentinel({"sentinel-meta": meta}, 10))
        assert x.significant and not x.explained and x.machine is not None, x


def test_the_report_says_which_flagged_cells_moved_with_the_sentinel() -> None:
    """The report's drift section marks and names them, with the calibration and its change."""
    env, points = two_rising_cells(), meta_rising()
    empty = pd.DataFrame()
    tables = HostTables("h", "c", empty, empty, {}, empty, env)
    blocks = trend_blocks(tables, None, SentinelTable("h", "c", points, 10.0, 0.1))
    text = " ".join(str(b[1]) for b in blocks if b[0] == "p")
    assert "2 of the 2 cells tested drift significantly" in text, text
    assert "1 moved with the sentinel" in text and "native / create-small: sentinel-meta +" in text
    assert "1 did not move with it" in text and "native / seq-write: sentinel-" in text
    (table,) = [b[1] for b in blocks if b[0] == "table"]
    assert "(sig., machine)" in str(table) and "(sig.)" in str(table)
    alone = " ".join(str(b[1]) for b in trend_blocks(tables) if b[0] == "p")
    assert "No sentinel ran in this campaign" in alone
