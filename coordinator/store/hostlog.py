"""One host's record log of one campaign: ``records.jsonl``, appended and chained by the store.

The store is the log's one writer (appenders in several processes serialize on a lock file). It
links each new line into the log's hash chain and signs the link with the coordinator key
(``coordinator.store.chain``), and at finalization signs the log's head. What appending needs of the
file (the keys stored, the line count, the last line's digest) is read incrementally: an append
reads only what was written since the last one, never the whole file again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from contract.files import write_atomic
from contract.records import EnvironmentRecord
from contract.signing import CoordinatorKey, sha256_hex
from coordinator.store.chain import HEAD_FILE, Head, genesis, head_document, linked_line
from coordinator.store.views import OUTCOME_DECODER

RECORDS_FILE = "records.jsonl"
RECORDS_LOCK = RECORDS_FILE + ".lock"
LOST_FILE = "lost.jsonl"
PROVENANCE_FILE = "provenance.json"
KEY_PARTS = ("campaign", "host", "mode", "workload", "env_index", "attempt")
HEAD_BLOCK = 1 << 20  # bytes read at a time when a cold process counts a log's lines


def sync_file(path: Path) -> None:
    """fsync ``path``, a file or a directory (what was written to it, by any writer, reaches
    the disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def line_key(line: bytes) -> str:
    """Idempotency key of one stored record line (unparseable lines get a unique key)."""
    try:
        return OUTCOME_DECODER.decode(line).key()  # a few fields decoded, the rest skipped
    except msgspec.MsgspecError:
        pass
    try:
        d = json.loads(line)
        return "/".join(str(d[p]) for p in KEY_PARTS)
    except (ValueError, KeyError, TypeError):
        return f"<unparseable:{hash(line)}>"


def complete_lines(path: Path, offset: int) -> Iterator[bytes]:
    """The complete lines of ``path`` after byte ``offset``, newline included, streamed; a last
    line still being written (no newline yet) is left for the next look."""
    with open(path, "rb") as f:
        f.seek(offset)
        for line in f:
            if not line.endswith(b"\n"):
                return
            yield line


@dataclass
class HostLog:
    """The records file of one host in one campaign, as far as it has been read."""

    campaign: str
    host: str
    path: Path
    offset: int = 0
    keys: set[str] = field(default_factory=set)
    count: int = 0  # complete lines
    last: str | None = None  # digest of the last complete line

    def refresh(self) -> None:
        """Read what was appended since the last look (start over if the file shrank)."""
        size = self.path.stat().st_size if self.path.exists() else 0
        if size < self.offset:  # replaced behind our back: start over
            self.offset, self.keys, self.count, self.last = 0, set(), 0, None
        if size == self.offset:
            return
        for line in complete_lines(self.path, self.offset):
            self.keys.add(line_key(line[:-1]))
            self.count += 1
            self.last = sha256_hex(line[:-1])
            self.offset += len(line)

    def append(
        self,
        records: list[EnvironmentRecord],
        signer: CoordinatorKey,
        objects: list[dict[str, Any]] | None = None,
        *,
        sync: bool = True,
    ) -> int:
        """Append, linked and signed, every record whose key is absent; how many were.

        ``objects`` are the records' JSON objects as their hosts signed them (from the wire):
        stored as they are, so the stored bytes are what the host signed. Without ``sync`` the
        caller fsyncs the file itself (``sync_file``) before it calls the records stored: a
        group commit. A later append's fsync covers these lines too, so a chain that reached
        the disk never points past what is on it.
        """
        if not self.offset:  # a first append here may need the host's directory
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(RECORDS_LOCK), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.refresh()
            last = self.last or genesis(self.campaign, self.host)
            lines: list[bytes] = []
            keys: set[str] = set()
            for i, r in enumerate(records):
                if r.key() in self.keys or r.key() in keys:
                    continue
                data = objects[i] if objects is not None else r.to_json_dict()
                lines.append(linked_line(data, self.count + len(lines) + 1, last, signer))
                keys.add(r.key())
                last = sha256_hex(lines[-1])
            if lines:
                with open(self.path, "ab") as f:
                    f.write(b"\n".join(lines) + b"\n")
                    f.flush()
                    if sync:
                        os.fsync(f.fileno())
                self.offset = self.path.stat().st_size  # the lock held: only these lines came
                self.keys |= keys
                self.count, self.last = self.count + len(lines), last
        return len(lines)

    def _head_now(self) -> tuple[int, str | None]:
        """Complete lines and the last one's digest: from the index if read before, else by
        counting newlines block by block (no record parsed, the file never held whole: a cold
        coordinator finalizes a big log fast)."""
        if self.offset:
            self.refresh()
            return self.count, self.last
        count, last, pending = 0, b"", b""  # pending: bytes after the last newline seen
        if self.path.exists():
            with open(self.path, "rb") as f:
                while block := f.read(HEAD_BLOCK):
                    count += block.count(b"\n")
                    data = pending + block
                    cut = data.rfind(b"\n")
                    if cut >= 0:
                        last, pending = data[:cut].rsplit(b"\n", 1)[-1], data[cut + 1 :]
                    else:
                        pending = data
        return count, sha256_hex(last) if count else None

    def seal(self, signer: CoordinatorKey, planned: int) -> Path:
        """Sign the log's head (line count, last digest, lost marks, provenance, the ``planned``
        count)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(RECORDS_LOCK), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self._seal_locked(signer, planned)

    def _seal_locked(self, signer: CoordinatorKey, planned: int) -> Path:
        """``seal`` with the log's lock held."""
        count, last = self._head_now()
        lost, provenance = self.path.with_name(LOST_FILE), self.path.with_name(PROVENANCE_FILE)
        head = Head(self.campaign, self.host, count, last or genesis(self.campaign, self.host),
                    file_digest(lost) if lost.exists() else None, planned,
                    file_digest(provenance) if provenance.exists() else None)  # fmt: skip
        doc = head_document(head, signer)
        target = self.path.with_name(HEAD_FILE)
        if not target.exists() or target.read_bytes() != doc:  # equal heads: equal bytes
            write_atomic(target, doc)
        return target

    def write_provenance(self, data: bytes, signer: Callable[[], CoordinatorKey]) -> Path:
        """Replace the host's ``provenance.json``; a log already finalized has its head signed
        again over the new provenance (a host's last verdicts may come after its last record),
        with the environments planned that it was finalized with."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        path = self.path.with_name(PROVENANCE_FILE)
        with open(self.path.with_name(RECORDS_LOCK), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            write_atomic(path, data)
            head = self.path.with_name(HEAD_FILE)
            if head.exists():
                try:
                    planned = int(json.loads(head.read_bytes())["planned"])
                except (ValueError, KeyError, TypeError):  # not a head: verify names it
                    return path
                self._seal_locked(signer(), planned)
        return path
