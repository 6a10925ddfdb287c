"""What ``verify`` checks in the bytes of a campaign: the signed expansion, each host's log, heads.

Every check reads the files as stored. A record line must be canonical JSON that round-trips
byte for byte; its host signature and the coordinator's chain link are checked over bytes
derived from that very line. The structure of a host's log (sequence numbers and the digest
of the previous line) tells a removed, reordered, duplicated or replaced line; the signed head
tells a removed tail and an edited ``provenance.json`` (it holds the file's digest). Each
problem is one line naming the environment where one is known.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from contract.errors import HostKeyError, RecordRejected
from contract.records import SCHEMA_VERSION, EnvironmentRecord
from contract.signing import (
    COORDINATOR_SIGNER,
    record_key,
    sha256_hex,
    signature_ok,
    verify_record_data,
)
from coordinator.store.chain import (
    EXPANSION_SIG_FILE,
    HEAD_FILE,
    SIGNED_FILES,
    genesis,
    link_payload,
    parse_line,
    record_bytes,
    signed_body,
)
from coordinator.store.hostlog import LOST_FILE, PROVENANCE_FILE, file_digest
from coordinator.store.trust import HostRegistry

IDENTITY_RE = {
    name: re.compile(rf'"{name}":\s*("?)([^",}}]*)\1')
    for name in ("campaign", "host", "mode", "workload", "env_index", "attempt")
}


def identity(raw: bytes) -> str:
    """Best-effort environment key of a record line that no longer parses."""
    text = raw.decode("utf-8", errors="replace")
    parts = []
    for rx in IDENTITY_RE.values():
        m = rx.search(text)
        parts.append(m.group(2) if m else "?")
    return "/".join(parts)


def coordinator_signed(doc: dict[str, Any], data: bytes, registry: HostRegistry) -> str | None:
    """Why ``doc``'s ``key_id``/``ed25519`` is not a trusted coordinator's signature of ``data``."""
    signer, _, print_ = str(doc.get("key_id", "")).partition(":")
    public = registry.coordinator_key(print_) if signer == COORDINATOR_SIGNER else None
    if public is None:
        return (f"signed by {doc.get('key_id')!r}, not a coordinator key {registry.path} trusts "
                "(register it with 'sandbench hosts add --coordinator NAME PUBKEY')")  # fmt: skip
    if not signature_ok(public, doc.get("ed25519"), data):
        return "bad coordinator signature (changed after signing)"
    return None


def check_expansion(cdir: Path, registry: HostRegistry) -> list[str]:
    """Problems of the signed expansion: campaign.sig against campaign.json and plan.toml."""
    sig = cdir / EXPANSION_SIG_FILE
    if not sig.exists():
        return [
            (
                f"{EXPANSION_SIG_FILE}: missing: campaign.json and plan.toml are not signed by "
                "a coordinator key (a campaign stored before schema 4, or the file was removed)"
            )
        ]
    try:
        doc = json.loads(sig.read_bytes())
        files = dict(doc["files"])
    except (ValueError, KeyError, TypeError):
        return [f"{EXPANSION_SIG_FILE}: not a signature document (edited)"]
    why = coordinator_signed(doc, signed_body(doc), registry)
    if why:
        return [f"{EXPANSION_SIG_FILE}: {why}"]
    if doc.get("campaign") != cdir.name:
        return [f"{EXPANSION_SIG_FILE}: signs campaign {doc.get('campaign')!r}, not {cdir.name}"]
    problems = []
    for name in SIGNED_FILES:
        path = cdir / name
        actual = file_digest(path) if path.exists() else None
        if actual != files.get(name):
            what = "missing" if actual is None else "changed after the coordinator signed it"
            problems.append(f"{name}: {what} (its signed SHA-256 is {files.get(name)}, "
                            f"now {actual}; {EXPANSION_SIG_FILE})")  # fmt: skip
    return problems


@dataclass
class Line:
    """One line of a host's log as ``verify`` sees it."""

    pos: int
    raw: bytes
    key: str
    digest: str
    seq: int | None = None  # its coordinator-signed sequence number, if the link verified
    prev: str | None = None
    sound: bool = False  # content checks passed (the record is the host's, unchanged)
    duplicate: bool = False  # a byte-for-byte copy of an earlier line


@dataclass
class LogCheck:
    """What one host's log holds: its sound records and its problems."""

    host: str
    lines: list[Line] = field(default_factory=list)
    records: list[EnvironmentRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    old_schema: list[Line] = field(default_factory=list)

    def present(self) -> set[str]:
        """Environment keys of every line that names one (sound or not)."""
        return {line.key for line in self.lines}


def _content_problem(
    data: dict[str, Any], raw: bytes, campaign: str, host: str, registry: HostRegistry
) -> EnvironmentRecord | str:
    """The line's record if it is its host's unchanged record of this campaign, else why not."""
    if data.get("campaign") != campaign:
        return (f"belongs to campaign {data.get('campaign')!r}, not {campaign!r} (a record "
                "replayed from another campaign)")  # fmt: skip
    if data.get("host") != host:
        return f"a record of host {data.get('host')!r} stored under host {host!r}"
    if data.get("superseded") is not False:  # unsigned, and it would hide the record
        return "marked superseded, which neither a host nor the store ever writes"
    try:
        record = EnvironmentRecord.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        return f"not a valid record: {loc}: {err['msg']}"
    try:
        verify_record_data(data, registry, campaign=campaign)
    except (RecordRejected, HostKeyError) as exc:
        return str(exc).split(": ", 1)[-1]
    return record


def _link(data: dict[str, Any], campaign: str, host: str, registry: HostRegistry) -> str | None:
    """Why the line's chain link is not the coordinator's link for this log, if it is not."""
    chain = data.get("chain")
    if not isinstance(chain, dict) or not isinstance(chain.get("seq"), int):
        return "no chain link (not appended by the store)"
    payload = link_payload(campaign, host, chain["seq"], str(chain.get("prev")),
                           sha256_hex(record_bytes(data)))  # fmt: skip
    why = coordinator_signed(chain, payload, registry)
    if why:
        return (
            f"chain link does not verify for this campaign and host ({why}): forged, or "
            "copied from another campaign's or host's log"
        )
    return None


def check_lines(campaign: str, host: str, raws: list[bytes], registry: HostRegistry) -> LogCheck:
    """Each line's own checks (bytes, schema, host signature, chain link), then the structure."""
    out = LogCheck(host)
    seen: dict[str, int] = {}  # line digest -> first position
    for pos, raw in enumerate(raws, start=1):
        where = f"hosts/{host}/records.jsonl line {pos}"
        line = Line(pos, raw, identity(raw), sha256_hex(raw))
        out.lines.append(line)
        data, why = parse_line(raw)
        if data is None:
            out.problems.append(f"{line.key}: {where}: not a valid record: {why}")
            continue
        line.key = record_key(data)
        if data.get("schema") != SCHEMA_VERSION:
            out.old_schema.append(line)
            continue
        if line.digest in seen:
            out.problems.append(f"{line.key}: {where}: duplicate of line {seen[line.digest]}")
            line.duplicate = True
            continue
        seen[line.digest] = pos
        checked = _content_problem(data, raw, campaign, host, registry)
        problem = checked if isinstance(checked, str) else None
        link = _link(data, campaign, host, registry)
        if problem and problem.startswith("not a valid record"):
            out.problems.append(f"{line.key}: {where}: {problem}")
        elif problem or link:
            out.problems.append(f"{line.key}: {problem or link} ({where})")
        if not link:
            line.seq, line.prev = data["chain"]["seq"], str(data["chain"]["prev"])
        if isinstance(checked, EnvironmentRecord):
            line.sound = True
            out.records.append(checked)
    out.problems += _structure(out, campaign)
    out.problems += _old_schema(out)
    return out


def _structure(log: LogCheck, campaign: str) -> list[str]:
    """Removed, reordered and replaced lines, from sequence numbers and previous digests."""
    problems: list[str] = []
    later = {line.seq: line.pos for line in log.lines if line.seq is not None}
    last_seq, prev_digest, prev_ok = 0, genesis(campaign, log.host), True
    for line in log.lines:
        where = f"{line.key}: hosts/{log.host}/records.jsonl line {line.pos}"
        if line.duplicate:  # reported; the line after it links to the same bytes
            continue
        if line.seq is None:  # its own problem is reported; it still takes a place
            last_seq, prev_digest, prev_ok = last_seq + 1, line.digest, False
            continue
        ok = True
        if line.seq <= last_seq:
            problems.append(f"{where}: out of order (seq {line.seq} after seq {last_seq}): "
                            "reordered or moved")  # fmt: skip
            ok = False
        elif line.seq > last_seq + 1:
            gap = range(last_seq + 1, line.seq)
            if any(later.get(s, 0) > line.pos for s in gap):
                problems.append(f"{where}: out of order (seq {line.seq} before seq "
                                f"{gap[0]}): reordered")  # fmt: skip
            else:
                problems.append(f"{where}: {len(gap)} record(s) missing before it "
                                f"(seq {gap[0]}-{gap[-1]} removed)")  # fmt: skip
            ok = False
        elif line.prev != prev_digest and prev_ok:
            problems.append(f"{where}: does not follow line {line.pos - 1} (the line before it "
                            "was replaced or edited)")  # fmt: skip
            ok = False
        last_seq = max(last_seq, line.seq)
        prev_digest, prev_ok = line.digest, ok and line.sound
    return problems


def _old_schema(log: LogCheck) -> list[str]:
    """One problem for every record of an older schema in the log."""
    if not log.old_schema:
        return []
    first = log.old_schema[0]
    return [(f"{first.key}: hosts/{log.host}/records.jsonl: {len(log.old_schema)} record(s) of "
            f"an older schema than {SCHEMA_VERSION} (first: line {first.pos}), written before "
            "hash chains and raw-bytes signatures: they cannot be verified under the current "
            "rules")]  # fmt: skip


@dataclass(frozen=True)
class HeadCheck:
    """What a host's signed head says of its log as it stands."""

    problems: list[str]
    sealed: bool = False  # the head covers the log exactly as it stands
    # environments planned when it was finalized (the head is genuine, whatever the log became)
    finalized_planned: int | None = None


def check_head(cdir: Path, log: LogCheck, registry: HostRegistry) -> HeadCheck:
    """Problems of a host's signed head (a removed tail, a replaced last line, lost marks)."""
    hdir = cdir / "hosts" / log.host
    path, name = hdir / HEAD_FILE, f"hosts/{log.host}/{HEAD_FILE}"
    if not path.exists():
        return HeadCheck([])
    try:
        doc = json.loads(path.read_bytes())
        count, last, planned = int(doc["count"]), str(doc["last"]), int(doc["planned"])
    except (ValueError, KeyError, TypeError):
        return HeadCheck([f"{name}: not a head document (edited)"])
    why = coordinator_signed(doc, signed_body(doc), registry)
    if why or (doc.get("campaign"), doc.get("host")) != (cdir.name, log.host):
        return HeadCheck([f"{name}: {why or 'the head of another campaign or host'}"])
    by_seq = {line.seq: line for line in log.lines if line.seq is not None}
    final = by_seq.get(count)
    if count and final is None:
        top = max(by_seq, default=0)
        if top < count:
            return HeadCheck([(f"{name}: removed tail: the log was finalized with {count} "
                              f"records and ends at seq {top} (the last {count - top} "
                              "removed)")], finalized_planned=planned)  # fmt: skip
        return HeadCheck([(f"{name}: the line the log was finalized with (seq {count}) is gone "
                          "(replaced)")], finalized_planned=planned)  # fmt: skip
    if (final.digest if final else genesis(cdir.name, log.host)) != last:
        key = final.key if final else "?"
        why = f"seq {count} is not the line the log was finalized with (replaced since)"
        return HeadCheck([f"{key}: {name}: {why}"], finalized_planned=planned)
    lost = hdir / LOST_FILE
    if (file_digest(lost) if lost.exists() else None) != doc.get("lost"):
        return HeadCheck([f"hosts/{log.host}/{LOST_FILE}: changed after finalization"])
    problems = _provenance(hdir, doc, log.host)
    return HeadCheck(problems, not problems and count == len(log.lines), planned)


def _provenance(hdir: Path, head: dict[str, Any], host: str) -> list[str]:
    """Problems of a host's ``provenance.json`` against the digest its signed head holds."""
    path, name = hdir / PROVENANCE_FILE, f"hosts/{host}/{PROVENANCE_FILE}"
    actual = file_digest(path) if path.exists() else None
    if "provenance" not in head:
        if actual is None:
            return []
        return [(f"{name}: provenance not covered: the signed head ({HEAD_FILE}) holds no digest "
                "of it (finalized before heads signed the provenance), so its facts (cpu_model, "
                "kernel, tools, ...) are unchecked")]  # fmt: skip
    signed = head["provenance"]
    if actual == signed:
        return []
    what = "missing" if actual is None else "changed after finalization (an edited fact: "
    what += "" if actual is None else "cpu_model, kernel, tools, ...)"
    return [(f"{name}: provenance {what}: its signed SHA-256 is {signed}, now {actual} "
            f"({HEAD_FILE})")]  # fmt: skip
