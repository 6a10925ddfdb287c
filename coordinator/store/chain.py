"""What the coordinator key signs in the store: record links, final heads, the expansion.

Each host's ``records.jsonl`` of a campaign is a hash chain kept by the store, the one writer:
line ``seq`` carries ``chain = {seq, prev, key_id, ed25519}`` where ``prev`` is the SHA-256 of
line ``seq - 1``'s exact bytes (for ``seq`` 1, the genesis digest of campaign and host) and the
signature covers campaign, host, ``seq``, ``prev`` and the digest of the record's own bytes
(the line without its ``chain``). A line is the record's canonical JSON, so its bytes are a
function of its content and every check reads them as stored. At finalization the coordinator
signs the log's head (``head.json``: line count, last line's digest, digest of the lost marks,
digest of the host's ``provenance.json``, environments planned), so a removed tail or an edited
provenance shows; ``campaign.sig`` signs the exact bytes of ``campaign.json`` and
``plan.toml`` each time the store writes them; ``verification.json`` signs ``verify``'s verdict
with the SHA-256 of every file it checked (``coordinator.store.verdict`` reads it back).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract.signing import CoordinatorKey, canonical_json, sha256_hex

CHAIN_FORMAT = "sandbench-chain/1"
VERDICT_FORMAT = "sandbench-verdict/1"
HEAD_FILE = "head.json"
EXPANSION_SIG_FILE = "campaign.sig"
SIGNED_FILES = ("campaign.json", "plan.toml")


def genesis(campaign: str, host: str) -> str:
    """The ``prev`` of a host log's first line: a digest of campaign id and host."""
    return sha256_hex(f"{CHAIN_FORMAT}/genesis/{campaign}/{host}".encode())


def link_payload(campaign: str, host: str, seq: int, prev: str, record_digest: str) -> bytes:
    """The bytes a line's chain signature covers."""
    return f"{CHAIN_FORMAT}\n{campaign}\n{host}\n{seq}\n{prev}\n{record_digest}".encode()


def record_bytes(data: dict[str, Any]) -> bytes:
    """A record's own bytes: its canonical JSON without the store's ``chain``."""
    return canonical_json({k: v for k, v in data.items() if k != "chain"})


def linked_line(data: dict[str, Any], seq: int, prev: str, key: CoordinatorKey) -> bytes:
    """The stored line (no newline) of record object ``data`` as line ``seq`` after ``prev``."""
    own = {k: v for k, v in data.items() if k != "chain"}
    payload = link_payload(own["campaign"], own["host"], seq, prev, sha256_hex(canonical_json(own)))
    own["chain"] = {"seq": seq, "prev": prev, "key_id": key.key_id, "ed25519": key.sign(payload)}
    return canonical_json(own)


# --- parsing stored lines ------------------------------------------------------------------------
class _Duplicate(ValueError):
    """A JSON object that names one key twice."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """A stored line as its JSON object, or None and why it cannot be one as it stands."""
    try:
        text = raw.decode("utf-8")
        data = json.loads(text, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 at byte {exc.start}"
    except ValueError as exc:
        return None, f"not JSON ({exc}): truncated or edited"
    if not isinstance(data, dict):
        return None, "not a JSON object"
    again = canonical_json(data)
    if again == raw:
        return data, None
    try:  # a key named twice is one way not to round-trip: say so
        json.loads(text, object_pairs_hook=_pairs)
    except _Duplicate as exc:
        return None, f"names the key '{exc}' twice"
    at = next((i for i, (a, b) in enumerate(zip(again, raw, strict=False)) if a != b),
              min(len(again), len(raw)))  # fmt: skip
    return None, (
        f"does not round-trip byte for byte (differs at byte {at}: not sorted keys without "
        "whitespace, or a number not written as the host wrote it)"
    )


# --- final heads and the signed expansion --------------------------------------------------------
@dataclass(frozen=True)
class Head:
    """A host log's state as finalization saw it."""

    campaign: str
    host: str
    count: int  # lines in records.jsonl
    last: str  # digest of the last line (the genesis digest for an empty log)
    lost: str | None  # digest of lost.jsonl, None if there is none
    planned: int  # environments planned for the host when it was finalized
    provenance: str | None = None  # digest of provenance.json, None if there is none

    def body(self) -> dict[str, Any]:
        """The signed fields."""
        return {"campaign": self.campaign, "host": self.host, "count": self.count,
                "last": self.last, "lost": self.lost, "planned": self.planned,
                "provenance": self.provenance, "format": CHAIN_FORMAT}  # fmt: skip


def head_document(head: Head, key: CoordinatorKey) -> bytes:
    """``head.json``'s bytes: the head, signed by ``key`` (deterministic for equal heads)."""
    body = head.body()
    signed = {**body, "key_id": key.key_id, "ed25519": key.sign(canonical_json(body))}
    return canonical_json(signed) + b"\n"


def expansion_document(campaign: str, files: dict[str, bytes], key: CoordinatorKey) -> bytes:
    """``campaign.sig``'s bytes: the digests of the campaign's signed files, signed by ``key``."""
    body = {"campaign": campaign, "format": CHAIN_FORMAT,
            "files": {name: sha256_hex(data) for name, data in sorted(files.items())}}  # fmt: skip
    signed = {**body, "key_id": key.key_id, "ed25519": key.sign(canonical_json(body))}
    return json.dumps(signed, indent=1, sort_keys=True).encode() + b"\n"


def verdict_document(campaign: str, result: Mapping[str, object], key: CoordinatorKey) -> bytes:
    """``verification.json``'s bytes: ``verify``'s verdict and the digests of every file it
    checked, for ``campaign``, signed by ``key``."""
    body = {**result, "campaign": campaign, "format": VERDICT_FORMAT}
    signed = {**body, "key_id": key.key_id, "ed25519": key.sign(canonical_json(body))}
    return json.dumps(signed, indent=2, sort_keys=True, ensure_ascii=False).encode() + b"\n"


def signed_body(doc: dict[str, Any]) -> bytes:
    """The bytes a head, expansion or verdict document's signature covers."""
    return canonical_json({k: v for k, v in doc.items() if k not in ("key_id", "ed25519")})
