"""The gate: one planned environment to one signed record, the same in both transports.

``run_planned`` is all a transport calls. In order: the spec must be for this host and signed
by the coordinator key this host trusts (``admit``: anything else is refused before any of it
runs, with ``SpecRefused`` and no record); the mode's preflight verdict (asked once per campaign
and mode on this host) must be ok, else the record is ``not-run`` with reason
``preflight: <why>`` and nothing runs (on a fleet worker a command mode's verdict is first the
worker's own allowlist, ``worker.config``); no environment planned earlier in
the cell (same attempt) may have failed, else it is ``not-run`` under the first-failure rule;
then the runner, where a harness error becomes a failed record rather than a lost environment;
a failure becomes evidence for the rule; the record is signed with the host key. A sentinel
environment (``kind = "sentinel"``, ``coordinator.plan.sentinel``) is in no cell: the rule neither
skips it nor learns from it.

The transports differ only in where the rule's evidence lives (``CellFailures``): the fleet
keeps a flag per cell in Redis (``worker.fleet``), the embedded executor the records it stored
(``RecordedFailures``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from contract.errors import SandbenchError, SpecRefused
from contract.records import (
    CellAttempt,
    EnvironmentRecord,
    EnvironmentSpec,
    NotRun,
    cell_attempt,
    failed_fields,
    not_run_reason,
)
from contract.signing import HostKey, sign_record
from contract.spec_signing import check_spec
from worker.config import Allowlist
from worker.modes import HostInfo, Preflight, get_mode
from worker.modes.command import is_command_mode
from worker.runner import Following, Prepared, run_environment
from workloads.registry import Models

log = logging.getLogger(__name__)

RULE_DETAIL = "an earlier environment of this cell failed"


def rule_applies(first_failed: int | None, spec: EnvironmentSpec) -> bool:
    """Whether the cell's first failure (its planned order index, if any) came before ``spec``."""
    return first_failed is not None and first_failed < spec.order_index


class CellFailures(Protocol):
    """Evidence for the first-failure rule: the earliest failed environment of each cell attempt."""

    def failed_before(self, spec: EnvironmentSpec) -> bool:
        """Whether an environment planned before ``spec`` in its cell attempt has failed."""
        ...

    def mark_failed(self, spec: EnvironmentSpec) -> None:
        """Note that ``spec``'s environment failed."""
        ...


class RecordedFailures:
    """The rule's evidence in memory, seeded from the records already stored."""

    def __init__(self, records: Iterable[EnvironmentRecord] = ()) -> None:
        self._first: dict[CellAttempt, int] = {}
        for record in records:
            if record.outcome == "failed":
                self._note(cell_attempt(record), record.order_index)

    def failed_before(self, spec: EnvironmentSpec) -> bool:
        """Whether an environment planned before ``spec`` in its cell attempt has failed."""
        return rule_applies(self._first.get(cell_attempt(spec)), spec)

    def mark_failed(self, spec: EnvironmentSpec) -> None:
        """Note that ``spec``'s environment failed."""
        self._note(cell_attempt(spec), spec.order_index)

    def _note(self, cell: CellAttempt, order_index: int) -> None:
        self._first[cell] = min(order_index, self._first.get(cell, order_index))


VerdictHook = Callable[[EnvironmentSpec, Preflight], None]
EMBEDDED_TRUST = "this machine's own coordinator key (the embedded run)"


@dataclass
class HostState:
    """This host as the gate sees it: its key (and so its name), work root, the coordinator key
    it trusts, its allowlist of command modes, its mode verdicts and the oracle's models."""

    key: HostKey
    work_root: Path
    on_verdict: VerdictHook | None = None  # told each new verdict (the provenance keeps them)
    verdicts: dict[tuple[str, str, str], Preflight] = field(default_factory=dict)
    coordinator: str | None = None  # the trusted coordinator public key (base64)
    coordinator_from: str = EMBEDDED_TRUST  # where that trust comes from, for messages
    allowlist: Callable[[], Allowlist] | None = None  # None: the embedded run trusts its plan
    models: Models = field(default_factory=Models)  # the oracle's, reused across environments

    @property
    def name(self) -> str:
        """This host's name: the one its key signs for."""
        return self.key.name

    def info(self) -> HostInfo:
        """What a mode's preflight and the runner know about this host."""
        return HostInfo(name=self.name, work_root=self.work_root)

    def preflight(self, spec: EnvironmentSpec) -> Preflight:
        """``spec``'s mode's verdict on this host, asked once per campaign and mode."""
        options = json.dumps(spec.mode_options, sort_keys=True, default=str)
        slot = (spec.campaign, spec.mode, options)
        if slot not in self.verdicts:
            allowed = self.allowlist() if self.allowlist is not None else None
            self.verdicts[slot] = ask_preflight(spec, self.info(), allowed)
            if self.on_verdict is not None:
                self.on_verdict(spec, self.verdicts[slot])
        return self.verdicts[slot]

    def mode_verdicts(self, campaign: str) -> dict[str, dict[str, Any]]:
        """Each mode's verdict so far in ``campaign``, as the host's provenance lists them."""
        mine = ((mode, v) for (c, mode, _), v in self.verdicts.items() if c == campaign)
        return {mode: verdict_facts(verdict) for mode, verdict in mine}


def verdict_facts(verdict: Preflight) -> dict[str, Any]:
    """A preflight verdict as provenance records it: ok, reason and the mode's facts."""
    return {"ok": verdict.ok, "reason": verdict.reason, **verdict.facts}


def ask_preflight(
    spec: EnvironmentSpec, host: HostInfo, allowlist: Allowlist | None = None
) -> Preflight:
    """The mode's own verdict; a mode that cannot load, or whose check raises, is not ok.

    With an ``allowlist`` (a fleet worker's), a command mode it does not name is not ok either,
    whatever the spec says: its template never runs, not even its preflight.
    """
    if allowlist is not None and is_command_mode(spec.mode, spec.mode_options):
        refusal = allowlist.refusal(spec.mode)
        if refusal is not None:
            return Preflight(False, refusal)
    try:
        return get_mode(spec.mode, spec.mode_options).preflight(host)
    except SandbenchError as exc:  # unknown mode, bad options: the message says what to fix
        return Preflight(False, str(exc))
    except Exception as exc:  # a check that crashes cannot vouch for the mode
        log.exception("preflight of mode %s raised", spec.mode)
        return Preflight(False, f"preflight error: {type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class Span:
    """Wall-clock start and end (epoch seconds) of the gate's work on one environment."""

    started: float
    ended: float


Annotate = Callable[[Span], dict[str, Any]]


def run_planned(
    spec: EnvironmentSpec,
    host: HostState,
    failures: CellFailures,
    *,
    stop: threading.Event | None = None,
    annotate: Annotate | None = None,
    prepared: Prepared | None = None,
    following: Following | None = None,
) -> EnvironmentRecord | None:
    """The signed record of one planned environment of this host; None if stopped mid-way.

    ``annotate`` adds the transport's own fields (signed with the record); a stopped
    environment has no record, so a resume or a redelivery runs it again fresh. ``prepared``
    is its preparation done ahead (``worker.ahead``; discarded if it is not run after all),
    ``following`` the runner's hooks for the next one.
    """
    try:
        admit(spec, host)
    except SpecRefused:
        if prepared is not None:
            prepared.discard()
        raise
    spec = for_this_host(spec, host)
    started = time.time()
    record = _decide(spec, host, failures, stop, prepared, following)
    if record is None or (stop is not None and stop.is_set() and record.outcome == "failed"):
        return None
    if record.outcome == "failed" and spec.kind == "environment":  # a sentinel is in no cell
        failures.mark_failed(spec)
    if annotate is not None:
        extra = annotate(Span(started, time.time()))
        record = EnvironmentRecord.model_validate({**record.to_json_dict(), **extra})
    return sign_record(record, host.key)


def admit(spec: EnvironmentSpec, host: HostState) -> None:
    """Raise ``SpecRefused`` unless ``spec`` is for this host and signed by its coordinator."""
    if spec.host != host.name:
        raise SpecRefused(
            f"environment {spec.key()} is for host {spec.host}, this is {host.name}",
            "spec for another host",
        )
    check_spec(spec, host.coordinator, host.coordinator_from)


def for_this_host(spec: EnvironmentSpec, host: HostState) -> EnvironmentSpec:
    """``spec`` as this host runs it: in its own work root."""
    return spec.model_copy(update={"work_root": str(host.work_root)})


def not_run(spec: EnvironmentSpec, reason: str, detail: str | None = None) -> EnvironmentRecord:
    """The unsigned ``not-run`` record of a planned environment."""
    return EnvironmentRecord.from_spec(spec, outcome="not-run", reason=reason, detail=detail)


def skipped(
    spec: EnvironmentSpec, verdict: Preflight, failures: CellFailures
) -> EnvironmentRecord | None:
    """The ``not-run`` record if the mode's verdict or the first-failure rule skips ``spec``."""
    if not verdict.ok:
        return not_run(spec, not_run_reason(NotRun.PREFLIGHT, verdict.reason or ""))
    if spec.kind == "environment" and failures.failed_before(spec):
        return not_run(spec, not_run_reason(NotRun.RULE), RULE_DETAIL)
    return None


def _decide(
    spec: EnvironmentSpec,
    host: HostState,
    failures: CellFailures,
    stop: threading.Event | None,
    prepared: Prepared | None = None,
    following: Following | None = None,
) -> EnvironmentRecord | None:
    """Preflight, then the rule, then the runner: the unsigned record (None if stopped)."""
    verdict = host.preflight(spec)
    if (skip := skipped(spec, verdict, failures)) is not None:
        if prepared is not None:  # prepared ahead before the failure that skips it was known
            prepared.discard()
        return skip
    try:
        return run_environment(
            spec, host=host.info(), stop=stop, preflight=verdict, models=host.models,
            prepared=prepared, following=following,
        )  # fmt: skip
    except Exception as exc:  # a harness error is data, never a lost environment
        log.exception("environment %s: harness error", spec.key())
        detail = f"harness error on {host.name}: {type(exc).__name__}: {exc}"
        return EnvironmentRecord.from_spec(spec, **failed_fields("launcher-error", detail))
