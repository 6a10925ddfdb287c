"""Environment specs and records: the versioned wire and store format.

Record format versions (bump ``SCHEMA_VERSION`` and list every change here):

* 1 -- first version (design's record fields plus ``seed``, ``scale``, ``tools``, ``accel``).
* 2 -- optional ``leftover_processes``: processes left in the environment's cgroup when the
  launcher exited, killed at once (absent when the launcher did not exit by itself).
* 3 -- ``kind``: ``environment`` (one of a cell's) or ``sentinel`` (a calibration environment
  of the machine-state sentinel, never in a cell); ``wall_s``: host seconds of the whole
  environment, preparation to cleanup (absent for one that did not run).
* 4 -- ``chain``: the store's link of the record into its host's log (``seq``, the SHA-256
  ``prev`` of the line before, the coordinator key's ``key_id`` and ``ed25519`` signature),
  added by the coordinator as it appends and never signed by the host. Every signature is
  checked over the stored line's own bytes, which must be canonical JSON (sorted keys, no
  whitespace, each number as Python writes it): a line that does not round-trip byte for byte
  is rejected. Specs carry ``coordinator_key`` and ``spec_signature``.
* 5 -- reason ``quota-escaped`` (class resource: the work ran outside the environment's
  cgroup); optional ``payload_cpu_s``: the CPU time the payload reported for itself and its
  children at its last done line (``getrusage``), which the cgroup's ``cpu_s`` is checked
  against.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field

from contract.names import Name

SCHEMA_VERSION = 5

Outcome = Literal["passed", "failed", "not-run"]
FailureClass = Literal["startup", "task", "resource"]
# What an environment is for: a cell's measurement, or the machine-state sentinel's calibration.
Kind = Literal["environment", "sentinel"]

# Outcome table of the design: every reason belongs to exactly one class.
REASONS: dict[str, FailureClass] = {
    "launcher-error": "startup",
    "no-ready": "startup",
    "round-error": "task",
    "validation-failed": "task",
    "nonzero-exit": "task",
    "oracle-mismatch": "task",
    "workspace-modified": "task",
    "timeout": "resource",
    "oom": "resource",
    "no-space": "resource",
    "quota-escaped": "resource",
}


def environment_key(
    campaign: str, host: str, mode: str, workload: str, env_index: int, attempt: int
) -> str:
    """An environment's idempotency key, ``campaign/host/mode/workload/env_index/attempt``: the
    one place it is spelled (specs, records and the store's fast views all call it)."""
    return f"{campaign}/{host}/{mode}/{workload}/{env_index}/{attempt}"


class CellAttempt(NamedTuple):
    """The unit the first-failure rule judges: one attempt of one cell on one host."""

    campaign: str
    host: str
    mode: str
    workload: str
    attempt: int


class InCell(Protocol):
    """Anything placed in a cell attempt: a spec, a record, or a fast view of either."""

    @property
    def campaign(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def workload(self) -> str: ...
    @property
    def attempt(self) -> int: ...


def cell_attempt(item: InCell) -> CellAttempt:
    """The cell attempt ``item`` belongs to."""
    return CellAttempt(item.campaign, item.host, item.mode, item.workload, item.attempt)


class NotRun(StrEnum):
    """Why a planned environment was not run: the two kinds the design knows.

    A ``not-run`` record's ``reason`` is the rule's kind itself, or ``preflight: <why>``; this
    module alone writes and reads that text (``not_run_reason``, ``not_run_kind``).
    """

    RULE = "first-failure-rule"  # an earlier environment of its cell failed
    PREFLIGHT = "preflight"  # its mode's preflight failed on this host


NOT_RUN_RULE = NotRun.RULE.value
_PREFLIGHT_PREFIX = f"{NotRun.PREFLIGHT.value}: "


def not_run_reason(kind: NotRun, why: str = "") -> str:
    """The ``reason`` a not-run record of ``kind`` carries (``why`` is the preflight's)."""
    if kind is NotRun.RULE:
        return NOT_RUN_RULE
    return _PREFLIGHT_PREFIX + (why or "unavailable")


def not_run_kind(outcome: str, reason: str | None) -> NotRun | None:
    """The kind of a not-run record by its outcome and reason; None if it ran, or if the
    reason is neither kind (verify names that as a violation)."""
    if outcome != "not-run":
        return None
    if reason == NOT_RUN_RULE:
        return NotRun.RULE
    if (reason or "").startswith(_PREFLIGHT_PREFIX):
        return NotRun.PREFLIGHT
    return None


def preflight_why(reason: str | None) -> str:
    """What the failed preflight said, from a preflight not-run record's ``reason``."""
    return (reason or "").removeprefix(_PREFLIGHT_PREFIX)


GIB = 1024**3


class Quota(BaseModel):
    """Resource quota of one environment's whole process tree."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: str = "0,1"  # CPU affinity (cpuset list syntax)
    cpu_quota: float = Field(2.0, gt=0)  # cores of CPU time per wall second
    memory_bytes: int = Field(2 * GIB, gt=0)
    swap_bytes: int = Field(0, ge=0)


class VmSize(BaseModel):
    """Size of a VM mode's guest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vcpus: int = Field(2, gt=0)
    memory_mib: int = Field(512, gt=0)


class EnvironmentSpec(BaseModel):
    """Everything a worker needs to run one environment; its key is ``key()``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    campaign: Name  # names become file and cgroup names: see ``contract.names``
    cohort: Name = "default"
    host: Name
    mode: Name
    workload: Name
    env_index: int = Field(ge=0)
    attempt: int = Field(1, ge=1)
    order_index: int = Field(0, ge=0)
    task_id: str | None = None
    seed: int = 0
    scale: float = Field(1.0, gt=0, allow_inf_nan=False)
    rounds: int = Field(3, ge=1)
    limit_s: float = Field(90.0, gt=0, allow_inf_nan=False)
    quota: Quota = Quota()
    vm: VmSize = VmSize()
    work_root: str
    # mode-specific settings, e.g. the command template of a ``command`` mode
    mode_options: dict[str, Any] = Field(default_factory=dict)
    kind: Kind = "environment"  # a sentinel is in no cell: see ``coordinator.plan.sentinel``
    # Who sent it: the coordinator key's id and its signature over the spec's canonical JSON
    # (every other field); workers run only specs their trusted coordinator key signed.
    coordinator_key: str | None = None
    spec_signature: str | None = None

    def key(self) -> str:
        """The idempotency key (``environment_key``)."""
        return environment_key(
            self.campaign, self.host, self.mode, self.workload, self.env_index, self.attempt
        )

    def cell(self) -> tuple[str, str, str]:
        """The cell (host, mode, workload) this environment belongs to."""
        return (self.host, self.mode, self.workload)


class RoundRecord(BaseModel):
    """One round's host-observed task time and its validation."""

    model_config = ConfigDict(extra="forbid")

    k: int
    task_s: float
    validated: bool
    digest: str | None = None


class OracleResult(BaseModel):
    """The host oracle's verdict on the final state."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    mismatches: list[str] = Field(default_factory=list)


class Signature(BaseModel):
    """Ed25519 signature of a record's canonical JSON (without this field)."""

    model_config = ConfigDict(extra="forbid")

    key_id: str
    ed25519: str


class ChainLink(BaseModel):
    """A stored record's place in its host's log, signed by the coordinator key that stored it."""

    model_config = ConfigDict(extra="forbid")

    seq: int = Field(ge=1)  # 1 for the first line of the host's log of the campaign
    prev: str  # SHA-256 (hex) of the previous line's exact bytes; the genesis digest for seq 1
    key_id: str
    ed25519: str


# The fields a record copies from its spec under the same name (``rounds`` is ``rounds_planned``).
SPEC_IDENTITY = ("campaign", "cohort", "host", "mode", "workload", "env_index", "attempt",
                 "order_index", "task_id", "seed", "scale", "kind")  # fmt: skip


class EnvironmentRecord(BaseModel):
    """The result of one environment, run or not; signed by the host that produced it."""

    model_config = ConfigDict(extra="allow")

    schema_: int = Field(SCHEMA_VERSION, alias="schema")
    campaign: Name
    cohort: Name = "default"
    host: Name
    mode: Name
    workload: Name
    env_index: int
    attempt: int = 1
    order_index: int = 0
    task_id: str | None = None
    outcome: Outcome
    failure_class: FailureClass | None = None
    reason: str | None = None
    detail: str | None = None
    ready_ms: float | None = None
    rounds: list[RoundRecord] = Field(default_factory=list)
    exit_code: int | None = None
    oracle: OracleResult | None = None
    original_intact: bool | None = None
    leftover_processes: int | None = None
    cpu_s: float | None = None
    payload_cpu_s: float | None = None  # the payload's own getrusage (self + children)
    peak_memory_bytes: int | None = None
    started_at: str | None = None
    seed: int | None = None
    scale: float | None = None
    rounds_planned: int | None = None
    provenance: dict[str, Any] = Field(default_factory=dict)  # per-environment facts (accel, tools)
    kind: Kind = "environment"
    wall_s: float | None = None  # host seconds of the whole environment, prepare to cleanup
    superseded: bool = False
    signature: Signature | None = None
    chain: ChainLink | None = None  # added by the store (coordinator), never by the host

    def key(self) -> str:
        """The idempotency key (``environment_key``)."""
        return environment_key(
            self.campaign, self.host, self.mode, self.workload, self.env_index, self.attempt
        )

    def to_json_dict(self) -> dict[str, Any]:
        """The record as the design's JSON object (``schema`` key, ``None`` kept)."""
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def from_spec(cls, spec: EnvironmentSpec, **fields: Any) -> EnvironmentRecord:
        """A record carrying the identity fields of ``spec``."""
        identity = {name: getattr(spec, name) for name in SPEC_IDENTITY}
        return cls(**identity, rounds_planned=spec.rounds, **fields)


def failed_fields(reason: str, detail: str | None = None) -> dict[str, Any]:
    """The outcome fields of a failure with ``reason`` (class looked up in ``REASONS``)."""
    return {
        "outcome": "failed",
        "failure_class": REASONS[reason],
        "reason": reason,
        "detail": detail,
    }
