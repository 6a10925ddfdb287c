"""The next environment prepared while the one before it is checked and cleaned up (issue 25):
unmeasured work overlaps only unmeasured work, never an environment's drive."""

from __future__ import annotations

import itertools
from pathlib import Path

import psutil
import pytest

from contract.records import NOT_RUN_RULE, EnvironmentRecord
from coordinator.store.store import Store
from tests.test_campaign_local import Lab, _campaign_id, _leftover_environments
from worker import trash
from worker.runner import PHASES

PLAN = """
name = "overlap"
seed = 3
scale = 0.05
environments = 2
rounds = 2
workloads = ["publish", "create-small", "copy-tree"]
modes = ["native", "staged", { name = "always-fails", template = ["/bin/false"] }]
"""
UNMEASURED = ("prepare", "oracle", "cleanup")


def spans(record: EnvironmentRecord, phase: str) -> list[tuple[float, float]]:
    """The monotonic (start, end) spans of one phase of ``record``."""
    extra = record.model_extra or {}
    return [(a, b) for a, b in (extra.get("spans") or {}).get(phase, [])]


def intrusions(records: list[EnvironmentRecord]) -> list[str]:
    """Each unmeasured span of one record that overlaps another record's drive."""
    found = []
    for record, other in itertools.permutations(records, 2):
        for start, end in spans(record, "drive"):
            for phase in UNMEASURED:
                found += [
                    f"{other.key()} {phase} [{a}, {b}] in {record.key()}'s drive [{start}, {end}]"
                    for a, b in spans(other, phase)
                    if a < end and b > start
                ]
    return found


def test_no_preparation_or_cleanup_inside_any_drive(tmp_path: Path) -> None:
    """Every environment's drive (marker to exit: Ready, rounds, checks) holds no other
    environment's preparation, oracle or cleanup, while preparations did overlap the
    environments before them; a prepared environment the rule then skips leaves nothing."""
    lab = Lab(tmp_path)
    out = lab.sandbench("run", lab.plan(PLAN), *lab.run_args())
    records = sorted(Store(lab.data).records(_campaign_id(out.stdout)), key=lambda r: r.order_index)
    ran = [r for r in records if spans(r, "drive")]
    assert len(ran) >= 12  # 2 x 3 x 2 passed, 3 failed, and the sentinel's
    for record in ran:  # each phase's spans hold exactly its seconds (else what follows is void)
        phases = (record.model_extra or {})["phases"]
        hidden = (record.model_extra or {})["overlapped_s"]
        assert 0 <= hidden <= phases["prepare_s"], (record.key(), hidden, phases)
        for phase in PHASES:
            total = sum(b - a for a, b in spans(record, phase))
            assert total == pytest.approx(phases[f"{phase}_s"], abs=1e-4), (record.key(), phase)
    assert intrusions(ran) == []
    # The overlap happened: preparations started before the environment ahead of them ended.
    ahead = 0
    for before, record in itertools.pairwise(ran):
        extra = record.model_extra or {}
        if extra.get("overlapped_s", 0) > 0:
            assert spans(record, "prepare")[0][0] < spans(before, "cleanup")[-1][1]
            ahead += 1
    assert ahead >= len(ran) // 2, f"only {ahead} of {len(ran)} prepared ahead"
    # and so was its launcher's shim (its cgroup join off the critical path): the marker still
    # follows the join, and nothing of it lies in another drive (the intrusions above)
    for record in ran:
        if (record.model_extra or {}).get("overlapped_s", 0) > 0:
            assert record.provenance.get("shim_started_ahead") is True, record.key()
    # The overlap's seconds are counted once: the split still adds up (parts <= wall).
    line = next(x for x in out.stdout.splitlines() if x.startswith("wall time "))
    assert "preparation done ahead, beside the environment before: " in line
    for workload in ("publish", "create-small", "copy-tree"):  # the rule as always
        cell = [r for r in records if (r.mode, r.workload) == ("always-fails", workload)]
        assert [r.outcome for r in cell] == ["failed", "not-run"]
        assert cell[1].reason == NOT_RUN_RULE
    assert _leftover_environments(lab) == []
    # The wall time of a prepared-ahead environment is its own work, not its wait.
    for record in ran:
        phases = (record.model_extra or {})["phases"]
        assert record.wall_s is not None
        assert sum(phases.values()) <= record.wall_s + 1e-3
        assert sum(phases.values()) > 0.8 * record.wall_s, (record.key(), phases, record.wall_s)


def test_an_environment_prepared_ahead_and_then_skipped_leaves_nothing(tmp_path: Path) -> None:
    """A cell whose first environment fails: the second was already prepared (the failure was
    not known yet), the rule skips it, and it is removed unmeasured; the third is not prepared."""
    lab = Lab(tmp_path)
    plan = (
        'name = "skipped"\nseed = 1\nscale = 0.02\nenvironments = 3\nsentinel = false\n'
        'workloads = ["publish"]\n'
        'modes = [{ name = "always-fails", template = ["/bin/false"] }]\n'
    )
    out = lab.sandbench("run", lab.plan(plan), *lab.run_args())
    records = sorted(Store(lab.data).records(_campaign_id(out.stdout)), key=lambda r: r.order_index)
    assert [r.reason for r in records] == ["no-ready", NOT_RUN_RULE, NOT_RUN_RULE]
    assert _leftover_environments(lab) == []
    # the skipped one's launcher shim had started (ahead of a marker that never came): gone
    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
            if str(lab.work) in " ".join(p.info["cmdline"] or [])]  # fmt: skip
    assert left == []
    if trash.defers(lab.work):  # removed into the trash: two environments were prepared
        assert trash.held(lab.work) == 2
    else:  # deleted at once: nothing to count them by
        assert not (lab.work / trash.TRASH_DIR).exists()
