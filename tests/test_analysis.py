"""Statistics of hand-built records equal hand computations (cells, coverage, startup, tails)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from contract.records import (
    NOT_RUN_RULE,
    EnvironmentRecord,
    EnvironmentSpec,
    OracleResult,
    RoundRecord,
    failed_fields,
)
from coordinator.results.analysis import Analysis, HostTables, analyze, bootstrap_ci

CID = "c-20261129-ab12"
_order = iter(range(10_000))


def _spec(host: str, mode: str, workload: str, i: int, attempt: int = 1) -> EnvironmentSpec:
    return EnvironmentSpec(
        campaign=CID,
        host=host,
        mode=mode,
        workload=workload,
        env_index=i,
        attempt=attempt,
        order_index=next(_order),
        work_root="/tmp/w",
    )


def _rec(
    spec: EnvironmentSpec,
    rounds: list[float] | None = None,
    ready: float | None = None,
    **fields: object,
) -> EnvironmentRecord:
    rr = [RoundRecord(k=k, task_s=t, validated=True) for k, t in enumerate(rounds or [], 1)]
    fields.setdefault("outcome", "passed")
    return EnvironmentRecord.from_spec(spec, rounds=rr, ready_ms=ready, **fields)


def _campaign() -> tuple[list[EnvironmentSpec], list[EnvironmentRecord]]:
    """Two hosts; lab-a has a complete, a failed, a pending, a preflight and a rerun cell."""
    np_ = [_spec("lab-a", "native", "publish", i) for i in range(3)]
    ns = [_spec("lab-a", "native", "seq-write", i) for i in range(3)]
    sp = [_spec("lab-a", "staged", "publish", i) for i in range(3)]
    vp = [_spec("lab-a", "vm", "publish", i) for i in range(3)]
    s1 = [_spec("lab-a", "staged", "seq-write", i) for i in range(3)]
    s2 = [_spec("lab-a", "staged", "seq-write", i, attempt=2) for i in range(3)]
    bp = [_spec("lab-b", "native", "publish", i) for i in range(3)]
    oracle_bad = {"oracle": OracleResult(ok=False, mismatches=["out/x"])}
    records = [
        _rec(np_[0], [0.1, 0.2, 0.3], 10.0), _rec(np_[1], [0.3, 0.3, 0.3], 30.0),
        _rec(np_[2], [0.25, 0.25, 0.25], 20.0),
        _rec(ns[0], [1.0, 1.0, 1.0], 15.0),
        _rec(ns[1], [2.0, 2.0, 2.0], 16.0, **failed_fields("oracle-mismatch", "out/x"),
             **oracle_bad),
        _rec(ns[2], outcome="not-run", reason=NOT_RUN_RULE),
        _rec(sp[0], [0.5, 0.5, 0.5], 40.0), _rec(sp[1], [0.6, 0.6, 0.6], 50.0),
        *[_rec(s, outcome="not-run", reason="preflight: no KVM and no TCG") for s in vp],
        _rec(s1[0], **failed_fields("timeout")),
        *[_rec(s, outcome="not-run", reason=NOT_RUN_RULE) for s in s1[1:]],
        _rec(s2[0], [0.1, 0.1, 0.1], 41.0), _rec(s2[1], [0.2, 0.2, 0.2], 42.0),
        _rec(s2[2], [0.4, 0.4, 0.4], 43.0),
        _rec(bp[0], [9.0, 9.0, 9.0], 1.0), _rec(bp[1], [8.0, 8.0, 8.0], 2.0),
        _rec(bp[2], [7.0, 7.0, 7.0], 3.0),
    ]  # fmt: skip
    return np_ + ns + sp + vp + s1 + s2 + bp, records


def _host(analysis: Analysis, host: str) -> HostTables:
    (t,) = [t for t in analysis.tables if t.host == host]
    return t


def _cell(t: HostTables, mode: str, workload: str) -> pd.Series:
    rows = t.cells[(t.cells["mode"] == mode) & (t.cells["workload"] == workload)]
    assert len(rows) == 1
    return rows.iloc[0]


def test_cells_match_hand_computation() -> None:
    """Medians only for complete cells; incomplete ones say why; reruns use the latest attempt."""
    specs, records = _campaign()
    a = _host(analyze(records, specs), "lab-a")
    c = _cell(a, "native", "publish")
    assert c["status"] == "complete" and c["task_s_median"] == pytest.approx(0.75)
    assert c["ready_ms_median"] == 20.0 and c["env_task_s"] == "0.600000;0.900000;0.750000"
    assert math.isnan(c["task_s_ci_low"]) and math.isnan(c["task_s_p95"])  # N=3: no tails
    c = _cell(a, "native", "seq-write")
    assert c["status"] == "incomplete" and math.isnan(c["task_s_median"])
    assert math.isnan(c["ready_ms_median"])
    assert c["reason"] == (
        "env 1 failed (task/oracle-mismatch: out/x); 1 not run under the first-failure-rule"
    )
    assert (c["passed"], c["failed"], c["not_run_rule"], c["ran"]) == (1, 1, 1, 2)
    c = _cell(a, "staged", "publish")
    assert c["status"] == "incomplete" and c["reason"] == "1 of 3 have no record yet"
    c = _cell(a, "vm", "publish")
    assert (
        c["status"] == "preflight-failed" and c["reason"] == "preflight failed: no KVM and no TCG"
    )
    assert c["not_run_preflight"] == 3 and c["ran"] == 0
    c = _cell(a, "staged", "seq-write")
    assert (c["status"], c["attempt"]) == ("complete", 2)
    assert c["task_s_median"] == pytest.approx(0.6) and c["ready_ms_median"] == 42.0


def test_coverage_and_startup_match_hand_computation() -> None:
    """Coverage counts current attempts only; startup range is min/median/max per mode."""
    specs, records = _campaign()
    analysis = analyze(records, specs)
    a = _host(analysis, "lab-a")
    assert a.coverage == {
        "planned": 15, "ran": 10, "passed": 9, "failed": 1, "not_run_rule": 1,
        "not_run_preflight": 3, "pending": 1, "complete_cells": 2, "cells": 5,
        "valid_rounds": 30, "superseded_records": 3,
    }  # fmt: skip
    startup = a.startup.set_index("mode")
    cols = ["n", "ready_ms_min", "ready_ms_median", "ready_ms_max"]
    assert list(startup.loc["native", cols]) == [4, 10.0, 17.5, 30.0]
    assert list(startup.loc["staged", cols]) == [5, 40.0, 42.0, 50.0]
    assert "vm" not in startup.index
    assert len(a.failures) == 1 and a.failures.iloc[0]["reason"] == "oracle-mismatch"
    assert int(analysis.raw["superseded"].sum()) == 3 and len(analysis.raw) == len(records)


def test_hosts_and_cohorts_are_never_mixed() -> None:
    """lab-b's cell and a second cohort's cell each get their own tables."""
    specs, records = _campaign()
    other = [s.model_copy(update={"cohort": "night", "host": "lab-b"}) for s in specs[-3:]]
    other_recs = [r.model_copy(update={"cohort": "night"}, deep=True) for r in records[-3:]]
    for r, s in zip(other_recs, other, strict=True):
        r.rounds[0] = RoundRecord(k=1, task_s=100.0 + s.env_index, validated=True)
    analysis = analyze(records + other_recs, specs + other)
    keys = [(t.host, t.cohort) for t in analysis.tables]
    assert keys == [("lab-a", "default"), ("lab-b", "default"), ("lab-b", "night")]
    b = _cell(analysis.tables[1], "native", "publish")
    assert b["task_s_median"] == pytest.approx(24.0) and b["ready_ms_median"] == 2.0
    night = _cell(analysis.tables[2], "native", "publish")
    assert night["task_s_median"] == pytest.approx(100.0 + 1 + 16.0)


def test_tails_appear_at_ten_and_thirty_environments() -> None:
    """N=10 adds a seeded bootstrap interval around the median, N=30 adds P95; never below."""
    for n in (10, 30):
        specs = [_spec("lab-a", "native", "publish", i) for i in range(n)]
        records = [_rec(s, [float(s.env_index + 1)], 1.0) for s in specs]
        c = _cell(analyze(records, specs).tables[0], "native", "publish")
        assert c["task_s_median"] == pytest.approx((n + 1) / 2)
        assert c["task_s_ci_low"] <= c["task_s_median"] <= c["task_s_ci_high"]
        values = np.arange(1.0, n + 1)
        draws = np.random.default_rng([0, n]).integers(0, n, size=(2000, n))  # seed 0, this N
        naive = np.percentile(np.median(values[draws], axis=1), [2.5, 97.5])
        assert (c["task_s_ci_low"], c["task_s_ci_high"]) == bootstrap_ci(values, 0)
        assert bootstrap_ci(values, 0) == pytest.approx(tuple(naive))
        if n == 10:
            assert math.isnan(c["task_s_p95"])
        else:
            assert c["task_s_p95"] == pytest.approx(28.55)  # linear: 28 + 0.55 * (29 - 28)
