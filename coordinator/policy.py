"""The first-failure rule re-derived from the records: by finalization and by ``verify``.

After the first failed environment of a cell (in the cell's planned order), the remaining
planned environments of that cell (same attempt) are not run; they get a ``not-run`` record
with reason ``first-failure-rule``. Each attempt of a cell (a fleet rerun) is judged alone. The
rule is applied live in one place, the gate (``worker.gate``); here it is only checked.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ValidationError

from tasks.errors import HostKeyError, RecordRejected
from tasks.records import NOT_RUN_PREFLIGHT_PREFIX, NOT_RUN_RULE, EnvironmentRecord, EnvironmentSpec
from tasks.signing import verify_record

if TYPE_CHECKING:
    from coordinator.registry import HostRegistry
    from coordinator.store import Store

CellAttempt = tuple[str, str, str, int]  # host, mode, workload, attempt


@dataclass(frozen=True)
class Violation:
    """A record (or missing record) that contradicts the registered rule or the plan."""

    key: str  # environment key (campaign/host/mode/workload/env_index/attempt)
    problem: str

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}"


def _cell_attempt(item: EnvironmentRecord | EnvironmentSpec) -> CellAttempt:
    return (item.host, item.mode, item.workload, item.attempt)


def is_rule_not_run(record: EnvironmentRecord) -> bool:
    """Whether ``record`` was skipped under the first-failure rule."""
    return record.outcome == "not-run" and record.reason == NOT_RUN_RULE


def is_preflight_not_run(record: EnvironmentRecord) -> bool:
    """Whether ``record`` was skipped because its mode's preflight failed."""
    return record.outcome == "not-run" and (record.reason or "").startswith(
        NOT_RUN_PREFLIGHT_PREFIX
    )


def _check_cell(
    planned: list[EnvironmentSpec], got: dict[str, EnvironmentRecord]
) -> list[Violation]:
    """Walk one cell attempt in planned order and compare every record with the rule."""
    out: list[Violation] = []
    failed_at: int | None = None
    for spec in sorted(planned, key=lambda s: s.order_index):
        rec = got.get(spec.key())
        if rec is None:
            continue
        if rec.order_index != spec.order_index:
            out.append(
                Violation(spec.key(), f"order index {rec.order_index}, planned {spec.order_index}")
            )
        if failed_at is not None and not (is_rule_not_run(rec) or is_preflight_not_run(rec)):
            out.append(Violation(spec.key(), f"{rec.outcome} after the cell's first failure"))
        if failed_at is None and is_rule_not_run(rec):
            out.append(Violation(spec.key(), "not run under the rule, but no earlier failure"))
        if (
            rec.outcome == "not-run"
            and rec.reason != NOT_RUN_RULE
            and not is_preflight_not_run(rec)
        ):
            out.append(Violation(spec.key(), f"not run for an unknown reason '{rec.reason}'"))
        if rec.outcome == "failed" and failed_at is None:
            failed_at = spec.order_index
    return out


def derive(
    records: Sequence[EnvironmentRecord],
    planned: Sequence[EnvironmentSpec],
    *,
    require_complete: bool = False,
) -> list[Violation]:
    """Every contradiction between ``records`` and the rule applied to the ``planned`` order."""
    out: list[Violation] = []
    by_key: dict[str, EnvironmentRecord] = {}
    for rec in records:
        if rec.key() in by_key:
            out.append(Violation(rec.key(), "recorded more than once"))
        by_key[rec.key()] = rec
    planned_keys = {s.key() for s in planned}
    out += [
        Violation(k, "record of an environment that was never planned")
        for k in by_key
        if k not in planned_keys
    ]
    cells: dict[CellAttempt, list[EnvironmentSpec]] = defaultdict(list)
    for spec in planned:
        cells[_cell_attempt(spec)].append(spec)
        if require_complete and spec.key() not in by_key:
            out.append(Violation(spec.key(), "planned but has no record"))
    for specs in cells.values():
        if specs[0].kind == "environment":  # a sentinel is in no cell: the rule ignores it
            out += _check_cell(specs, by_key)
    return out


# --- verify: signatures and the rule, from the raw records ---------------------------------------
IDENTITY_RE = {
    name: re.compile(rf'"{name}":\s*("?)([^",}}]*)\1')
    for name in ("campaign", "host", "mode", "workload", "env_index", "attempt")
}


def _identity(text: str) -> str:
    """Best-effort environment key of a record line that no longer parses."""
    parts = []
    for rx in IDENTITY_RE.values():
        m = rx.search(text)
        parts.append(m.group(2) if m else "?")
    return "/".join(parts)


def verify_campaign(store: Store, campaign_id: str, registry: HostRegistry) -> list[str]:
    """Every problem of a stored campaign: bad or foreign signatures, broken lines, rule breaks."""
    campaign = store.load_campaign(campaign_id)
    problems: list[str] = []
    good: list[EnvironmentRecord] = []
    for raw in store.raw_lines(campaign_id):
        where = f"hosts/{raw.host}/records.jsonl line {raw.lineno}"
        try:
            record = EnvironmentRecord.model_validate_json(raw.text)
        except ValidationError:
            problems.append(
                f"{_identity(raw.text)}: {where}: not a valid record (changed or truncated)"
            )
            continue
        try:
            verify_record(record, registry, campaign=campaign_id)
        except (RecordRejected, HostKeyError) as exc:
            problems.append(f"{exc} ({where})")
            continue
        if record.host != raw.host:
            problems.append(f"{record.key()}: stored under host '{raw.host}' ({where})")
            continue
        good.append(record)
    problems += [str(v) for v in derive(good, campaign.specs)]
    return problems
