"""Fast read-only views of the store's files: only the fields the report reads, decoded by msgspec.

Decoding a record line or campaign.json into these skips every other field unparsed, which is
what keeps the report of a 100,000-environment campaign within seconds. They are views, not
checks: ``verify`` still validates every record in full (schema and signature) through
``EnvironmentRecord``, and a line that does not decode here sends the report down that
validating path, which names the line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from contract.records import EnvironmentRecord, EnvironmentSpec, Outcome, environment_key

# The views' defaults are the schema's (one place): a field a line leaves out reads as the model.
_RECORD = {name: field.default for name, field in EnvironmentRecord.model_fields.items()}
_SPEC = {name: field.default for name, field in EnvironmentSpec.model_fields.items()}


class RoundView(msgspec.Struct):
    """The fields of a round the statistics read."""

    task_s: float
    validated: bool


class SignatureView(msgspec.Struct):
    """Who signed a record (``compare`` checks it is the same machine on both sides)."""

    key_id: str


class _Identity(msgspec.Struct):
    """A stored record's identity and outcome, and its idempotency key."""

    campaign: str
    host: str
    mode: str
    workload: str
    env_index: int
    outcome: Outcome
    attempt: int = _RECORD["attempt"]

    def key(self) -> str:
        """The record's idempotency key (``EnvironmentRecord.key``)."""
        return environment_key(
            self.campaign, self.host, self.mode, self.workload, self.env_index, self.attempt
        )


class RecordView(_Identity):
    """The fields of a stored record the statistics read."""

    cohort: str = _RECORD["cohort"]
    order_index: int = _RECORD["order_index"]
    failure_class: str | None = _RECORD["failure_class"]
    reason: str | None = _RECORD["reason"]
    detail: str | None = _RECORD["detail"]
    ready_ms: float | None = _RECORD["ready_ms"]
    rounds: list[RoundView] = msgspec.field(default_factory=list)
    superseded: bool = _RECORD["superseded"]
    signature: SignatureView | None = _RECORD["signature"]
    kind: str = _RECORD["kind"]  # or "sentinel" (coordinator.plan.sentinel)
    started_at: str | None = _RECORD["started_at"]
    wall_s: float | None = _RECORD["wall_s"]
    phases: dict[str, float] = msgspec.field(default_factory=dict)  # the runner's, unsigned extra


RECORD_DECODER = msgspec.json.Decoder(RecordView)


class OutcomeView(_Identity):
    """What finalization and the first-failure rule read of a stored record: identity, outcome."""

    order_index: int = _RECORD["order_index"]
    reason: str | None = _RECORD["reason"]
    kind: str = _RECORD["kind"]


OUTCOME_DECODER = msgspec.json.Decoder(OutcomeView)


def record_views(lines: Iterable[bytes]) -> list[RecordView]:
    """Records (JSON lines) as ``RecordView``; raises ``msgspec.MsgspecError`` on a bad line."""
    return [RECORD_DECODER.decode(line) for line in lines]


class PlannedView(msgspec.Struct):
    """The identity of a planned environment (campaign.json's ``environments`` entries)."""

    campaign: str
    host: str
    mode: str
    workload: str
    env_index: int
    cohort: str = _SPEC["cohort"]
    attempt: int = _SPEC["attempt"]
    order_index: int = _SPEC["order_index"]
    kind: str = _SPEC["kind"]

    def key(self) -> str:
        """The environment's idempotency key (``EnvironmentSpec.key``)."""
        return environment_key(
            self.campaign, self.host, self.mode, self.workload, self.env_index, self.attempt
        )


class CampaignView(msgspec.Struct):
    """A stored campaign as the report reads it: its header and every planned environment."""

    campaign: str
    created_at: str
    hosts: list[str]
    plan: dict[str, Any]
    environments: list[PlannedView]
    notes: list[str] = msgspec.field(default_factory=list)

    @property
    def id(self) -> str:
        """The campaign id."""
        return self.campaign


CAMPAIGN_DECODER = msgspec.json.Decoder(CampaignView)


def campaign_view(data: bytes) -> CampaignView:
    """campaign.json as a ``CampaignView``; raises ``msgspec.MsgspecError`` if it is not one."""
    return CAMPAIGN_DECODER.decode(data)
