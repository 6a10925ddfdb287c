"""The first-failure rule re-derived from the records (by finalization and ``verify``), and
``verify`` itself: the campaign's bytes (``coordinator.store.verify``), completeness and the rule.

After the first failed environment of a cell (in the cell's planned order), the remaining
planned environments of that cell (same attempt) are not run; they get a ``not-run`` record
with reason ``first-failure-rule``. Each attempt of a cell (a fleet rerun) is judged alone. The
rule is applied live in one place, the gate (``worker.gate``); here it is only checked.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypedDict

from pydantic import ValidationError

from contract.errors import StoreError
from contract.records import (
    CellAttempt,
    EnvironmentRecord,
    EnvironmentSpec,
    InCell,
    NotRun,
    cell_attempt,
    not_run_kind,
)
from coordinator.store.hostlog import LOST_FILE

if TYPE_CHECKING:
    from coordinator.store.store import Store
    from coordinator.store.trust import HostRegistry


class Judged(InCell, Protocol):
    """What the rule reads of a planned environment (a spec, or a fast view of one): its cell
    attempt (``InCell``), its place in the run order, its kind and key."""

    @property
    def order_index(self) -> int: ...
    @property
    def kind(self) -> str: ...
    def key(self) -> str: ...


class JudgedRecord(Judged, Protocol):
    """What the rule reads of a record (an ``EnvironmentRecord``, or a fast view of one)."""

    @property
    def outcome(self) -> str: ...
    @property
    def reason(self) -> str | None: ...


@dataclass(frozen=True)
class Violation:
    """A record (or missing record) that contradicts the registered rule or the plan."""

    key: str  # environment key (campaign/host/mode/workload/env_index/attempt)
    problem: str

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}"


def is_rule_not_run(record: JudgedRecord) -> bool:
    """Whether ``record`` was skipped under the first-failure rule."""
    return not_run_kind(record.outcome, record.reason) is NotRun.RULE


def is_preflight_not_run(record: JudgedRecord) -> bool:
    """Whether ``record`` was skipped because its mode's preflight failed."""
    return not_run_kind(record.outcome, record.reason) is NotRun.PREFLIGHT


def _check_cell(planned: list[Judged], got: dict[str, JudgedRecord]) -> list[Violation]:
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
        if rec.outcome == "not-run" and not_run_kind(rec.outcome, rec.reason) is None:
            out.append(Violation(spec.key(), f"not run for an unknown reason '{rec.reason}'"))
        if rec.outcome == "failed" and failed_at is None:
            failed_at = spec.order_index
    return out


def derive(
    records: Sequence[JudgedRecord],
    planned: Sequence[Judged],
    *,
    require_complete: bool = False,
) -> list[Violation]:
    """Every contradiction between ``records`` and the rule applied to the ``planned`` order."""
    out: list[Violation] = []
    by_key: dict[str, JudgedRecord] = {}
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
    cells: dict[CellAttempt, list[Judged]] = defaultdict(list)
    for spec in planned:
        cells[cell_attempt(spec)].append(spec)
        if require_complete and spec.key() not in by_key:
            out.append(Violation(spec.key(), "planned but has no record"))
    for specs in cells.values():
        if specs[0].kind == "environment":  # a sentinel is in no cell: the rule ignores it
            out += _check_cell(specs, by_key)
    return out


# --- verify: the campaign's bytes, completeness and the rule -------------------------------------
class VerificationJSON(TypedDict):
    """What ``verification.json`` holds before it is signed (``Verification.as_json``)."""

    ok: bool
    verdict: str
    problems: list[str]
    records: int
    missing: int
    unsealed: list[str]
    digests: dict[str, str]
    checked_at: str


@dataclass
class Verification:
    """What ``verify`` found in a campaign's bytes, and which bytes it checked."""

    campaign: str
    problems: list[str] = field(default_factory=list)
    records: int = 0  # record lines checked
    missing: int = 0  # planned environments without a record or lost mark (none later)
    unsealed: list[str] = field(default_factory=list)  # hosts not finalized as they stand
    digests: dict[str, str] = field(default_factory=dict)  # what was checked (Store.raw_digests)

    @property
    def ok(self) -> bool:
        """Verified: no problem, nothing missing, every host's log sealed as it stands."""
        return not self.problems and not self.missing and not self.unsealed

    @property
    def verdict(self) -> str:
        """One line: verified, incomplete (how), or UNVERIFIED (how many problems)."""
        if self.problems:
            return f"UNVERIFIED ({len(self.problems)} problems in {self.records} records)"
        if self.missing or self.unsealed:
            parts = [f"{self.missing} planned without a record"] if self.missing else []
            parts += [f"host {h} not finalized as it stands" for h in self.unsealed]
            return f"incomplete: {'; '.join(parts)}"
        return (f"verified ({self.records} records: signatures, hash chains, final heads, the "
                "signed expansion and the first-failure rule)")  # fmt: skip

    def as_json(self, checked_at: str) -> VerificationJSON:
        """``verification.json``: the verdict bound to the digests of the bytes checked."""
        return VerificationJSON(ok=self.ok, verdict=self.verdict, problems=self.problems,
                                records=self.records, missing=self.missing,
                                unsealed=self.unsealed, digests=self.digests,
                                checked_at=checked_at)  # fmt: skip


def verify_campaign(store: Store, campaign_id: str, registry: HostRegistry) -> Verification:
    """Every problem of a stored campaign's bytes, its completeness, and the rule re-derived."""
    from coordinator.store.verify import check_expansion, check_head, check_lines

    out = Verification(campaign_id, digests=store.raw_digests(campaign_id))
    cdir = store.campaign_dir(campaign_id)
    out.problems += check_expansion(cdir, registry)
    try:
        campaign = store.load_campaign(campaign_id)
    except (StoreError, ValueError, KeyError, ValidationError) as exc:
        out.problems.append(f"campaign.json: not a campaign file ({str(exc).splitlines()[0]})")
        return out
    good: list[EnvironmentRecord] = []
    for host in sorted(set(campaign.hosts) | set(store.hosts(campaign_id))):
        log = check_lines(campaign_id, host, store.log_lines(campaign_id, host), registry)
        head = check_head(cdir, log, registry)
        out.problems += log.problems + head.problems
        out.records += len(log.lines)
        good += log.records
        planned = campaign.host_specs(host)
        missing = _missing(planned, log.present(), store, campaign_id, host)
        finalized = head.finalized_planned == len(planned)  # no environment planned since
        out.problems += [f"{key}: {why}" for key, why in missing.named(finalized)]
        out.missing += missing.unnamed(finalized)
        if not (head.sealed or head.problems or missing.count) and planned:
            out.unsealed.append(host)
    out.problems += [str(v) for v in derive(good, campaign.specs)]
    return out


@dataclass
class Missing:
    """Planned environments of one host without a record or lost mark, and the latest recorded."""

    host: str
    specs: list[EnvironmentSpec]
    latest: dict[int, int]  # attempt -> highest order index recorded

    @property
    def count(self) -> int:
        """How many are missing."""
        return len(self.specs)

    def named(self, finalized: bool) -> list[tuple[str, str]]:
        """Those that are problems: the log was finalized, or a later environment has a record."""
        out = []
        for spec in self.specs:
            later = self.latest.get(spec.attempt, -1)
            if finalized:
                out.append((spec.key(), (f"planned but has no record, and host {self.host}'s "
                                        "log was finalized (a record was removed)")))  # fmt: skip
            elif later > spec.order_index:
                why = f"no record, but a later environment of host {self.host} (order {later})"
                out.append((spec.key(), f"{why} has one (a record was removed)"))
        return out

    def unnamed(self, finalized: bool) -> int:
        """Those still to come: an unfinished campaign's environments without a record yet."""
        return self.count - len(self.named(finalized))


def _missing(
    planned: list[EnvironmentSpec], present: set[str], store: Store, campaign: str, host: str
) -> Missing:
    """The planned environments of ``host`` that have neither a record line nor a lost mark."""
    lost_path = store.host_dir(campaign, host) / LOST_FILE
    lost = set()
    if lost_path.exists():
        for text in lost_path.read_text(errors="replace").splitlines():
            try:
                lost.add(str(json.loads(text)["key"]))
            except (ValueError, KeyError, TypeError):
                continue
    latest: dict[int, int] = {}
    for spec in planned:
        if spec.key() in present:
            latest[spec.attempt] = max(latest.get(spec.attempt, -1), spec.order_index)
    gone = [s for s in planned if s.key() not in present and s.key() not in lost]
    return Missing(host, gone, latest)
