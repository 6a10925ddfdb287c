"""The first-failure rule, applied live by the gate and re-derived from records."""

from __future__ import annotations

from contract.records import NOT_RUN_RULE, EnvironmentRecord, EnvironmentSpec, failed_fields
from coordinator.store.policy import derive
from worker.gate import RecordedFailures
from worker.gate import not_run as not_run_record

CID = "c-20261129-ab12"


def _cell(workload: str = "publish", orders: tuple[int, ...] = (4, 1, 7)) -> list[EnvironmentSpec]:
    return [
        EnvironmentSpec(
            campaign=CID,
            host="lab-a",
            mode="native",
            workload=workload,
            env_index=i,
            order_index=o,
            work_root="/tmp/w",
        )
        for i, o in enumerate(orders)
    ]


def _passed(spec: EnvironmentSpec) -> EnvironmentRecord:
    return EnvironmentRecord.from_spec(spec, outcome="passed")


def _failed(spec: EnvironmentSpec) -> EnvironmentRecord:
    return EnvironmentRecord.from_spec(spec, **failed_fields("oracle-mismatch"))


def rule_applies(records: list[EnvironmentRecord], spec: EnvironmentSpec) -> bool:
    """The gate's verdict for ``spec`` given the stored ``records``."""
    return RecordedFailures(records).failed_before(spec)


def test_rule_applies_only_after_an_earlier_failure_of_the_same_cell() -> None:
    """Only an earlier failure of the same cell and attempt stops a later environment."""
    a, b, c = _cell()  # run order: b (1), a (4), c (7)
    other = _cell("seq-write")
    assert not rule_applies([], a)
    assert rule_applies([_failed(b)], a) and rule_applies([_failed(b)], c)
    assert not rule_applies([_failed(other[1])], a)
    assert not rule_applies([_failed(c)], a)  # c comes later in the planned order
    assert not rule_applies([_failed(b)], a.model_copy(update={"attempt": 2}))
    assert not rule_applies([_failed(b)], a.model_copy(update={"campaign": "c-other"}))


def test_marked_failures_count_from_the_earliest() -> None:
    """A failure noted later but planned earlier moves the cell's first failure forward."""
    a, b, c = _cell()  # run order: b (1), a (4), c (7)
    failures = RecordedFailures([_passed(b)])
    failures.mark_failed(c)
    assert not failures.failed_before(a) and not failures.failed_before(c)
    failures.mark_failed(b)
    assert failures.failed_before(a) and failures.failed_before(c)


def test_derive_accepts_a_correct_history() -> None:
    """Pass, fail, then rule not-run in planned order gives no violation."""
    a, b, c = _cell()
    records = [_passed(b), _failed(a), not_run_record(c, NOT_RUN_RULE)]
    assert derive(records, [a, b, c], require_complete=True) == []


def test_derive_names_every_broken_environment() -> None:
    """Running after a failure, skipping without one, duplicates and gaps are each reported."""
    a, b, c = _cell()
    ran_after = derive([_failed(b), _passed(a), not_run_record(c, NOT_RUN_RULE)], [a, b, c])
    assert [str(v) for v in ran_after] == [f"{a.key()}: passed after the cell's first failure"]
    skipped = derive([not_run_record(b, NOT_RUN_RULE), _passed(a), _passed(c)], [a, b, c])
    assert [v.key for v in skipped] == [b.key()]
    dup = derive([_passed(b), _passed(b)], [a, b, c], require_complete=True)
    assert {v.problem for v in dup} == {"recorded more than once", "planned but has no record"}
