"""The campaign store: plan, expanded campaign, provenance and append-only signed records.

Layout under the data directory (design, "Store")::

    <campaign-id>/plan.toml            the plan as given
    <campaign-id>/campaign.json        expanded plan: every environment, host, order index, task id
    <campaign-id>/campaign.sig         the coordinator key's signature of the two files above
    <campaign-id>/hosts/<host>/provenance.json
    <campaign-id>/hosts/<host>/records.jsonl   append-only, one signed, chained record per line
    <campaign-id>/hosts/<host>/head.json       the log's final head, signed at finalization
    <campaign-id>/hosts/<host>/lost.jsonl      environments whose worker never came back
    <campaign-id>/hosts/<host>/results.csv     derived (report)
    <campaign-id>/report.md, report.html, plots/   derived (report)

Raw records are never rewritten. ``append_record`` inserts a record only if its
(environment, attempt) key is absent; appenders in several processes serialize on a lock file.
The store is the one writer of each host's log, so it links every line into the log's hash
chain as it appends and signs the link with the coordinator key (``coordinator.store.chain``); what
it needs of the file (keys, line count, last line's digest) it reads incrementally.
"""

from __future__ import annotations

import fcntl
import json
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import msgspec
from pydantic import ValidationError
from pydantic_core import from_json  # about twice as fast as json.loads on records

from contract.errors import StoreError
from contract.files import write_atomic
from contract.names import check_name, is_name
from contract.records import EnvironmentRecord, EnvironmentSpec
from contract.signing import CoordinatorKey
from contract.stamps import utc_now
from coordinator.store.chain import (
    EXPANSION_SIG_FILE,
    HEAD_FILE,
    expansion_document,
    verdict_document,
)
from coordinator.store.hostlog import (
    LOST_FILE,
    PROVENANCE_FILE,
    RECORDS_FILE,
    HostLog,
    file_digest,
    sync_file,
)
from coordinator.store.views import CampaignView, campaign_view

CAMPAIGN_FILE = "campaign.json"
PLAN_FILE = "plan.toml"
VERIFICATION_FILE = "verification.json"
LOCK_FILE = ".lock"
CAMPAIGN_SCHEMA = 1


@dataclass
class Campaign:
    """A stored campaign: its plan and every planned environment."""

    id: str
    plan_text: str
    plan: dict[str, Any]  # the validated plan as JSON (see ``coordinator.plan.file.Plan``)
    environments: list[dict[str, Any]]  # planned environments as stored (JSON)
    created_at: str
    hosts: list[str]
    notes: list[str] = field(default_factory=list)

    @cached_property
    def specs(self) -> list[EnvironmentSpec]:
        """Every planned environment, validated."""
        return [EnvironmentSpec.model_validate(e) for e in self.environments]

    def spec_by_key(self) -> dict[str, EnvironmentSpec]:
        """Planned environments by idempotency key."""
        return {s.key(): s for s in self.specs}

    def host_specs(self, host: str) -> list[EnvironmentSpec]:
        """Planned environments of ``host`` in their run order."""
        return sorted((s for s in self.specs if s.host == host), key=lambda s: s.order_index)


class Store:
    """Campaigns under one data directory (``--data``, default ``./.data``)."""

    def __init__(
        self, data_dir: Path | str = ".data", signer: CoordinatorKey | None = None
    ) -> None:
        self.root = Path(data_dir)
        self._signer = signer
        self._logs: dict[tuple[str, str], HostLog] = {}  # appends need not re-read a file
        # What coordinator.store.progress has read of this store (campaign files, record keys):
        # the store's own state, not the module's, so two stores never share it.
        self.progress_cache: dict[str, Any] = {}
        self.received_cache: dict[Path, tuple[int, set[str]]] = {}
        self.cache_lock = threading.Lock()  # the intake, task and sweep threads share them

    @property
    def signer(self) -> CoordinatorKey:
        """The coordinator key that signs what this store writes (this machine's, by default)."""
        if self._signer is None:
            from coordinator.store.trust import own_coordinator_key

            self._signer = own_coordinator_key()
        return self._signer

    # --- paths ---------------------------------------------------------------------------------
    def campaign_dir(self, campaign_id: str) -> Path:
        """Directory of one campaign (``InvalidName`` unless the id is a name)."""
        return self.root / check_name(campaign_id, "campaign id")

    def host_dir(self, campaign_id: str, host: str) -> Path:
        """Directory of one host's raw and derived files in a campaign."""
        return self.campaign_dir(campaign_id) / "hosts" / check_name(host, "host")

    def records_path(self, campaign_id: str, host: str) -> Path:
        """The append-only records file of one host."""
        return self.host_dir(campaign_id, host) / RECORDS_FILE

    def campaign_ids(self) -> list[str]:
        """Every stored campaign id, oldest first by name."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir() if is_name(p.name) and (p / CAMPAIGN_FILE).exists()
        )

    # --- campaign --------------------------------------------------------------------------------
    def create_campaign(
        self,
        plan_text: str,
        plan: Any,
        specs: list[EnvironmentSpec],
        *,
        campaign_id: str | None = None,
        notes: list[str] | None = None,
    ) -> str:
        """Store a new campaign (plan as given and its expansion); returns its id."""
        cid = campaign_id or (specs[0].campaign if specs else None)
        if cid is None:
            raise StoreError("a campaign with no environments needs an explicit campaign id")
        if any(s.campaign != cid for s in specs):
            raise StoreError(f"every environment of campaign {cid} must carry that campaign id")
        cdir = self.campaign_dir(cid)
        if cdir.exists():
            raise StoreError(f"{cdir} already exists; resume it with --resume {cid}")
        cdir.mkdir(parents=True)
        (cdir / PLAN_FILE).write_bytes(plan_text.encode("utf-8"))
        plan_json = plan.model_dump(mode="json") if hasattr(plan, "model_dump") else dict(plan)
        hosts = sorted({s.host for s in specs})
        self._write_campaign(cid, plan_json, specs, utc_now(), hosts, notes or [])
        for host in hosts:
            self.host_dir(cid, host).mkdir(parents=True, exist_ok=True)
        sync_file(cdir)  # the directory's new entries
        return cid

    def _write_campaign(
        self,
        cid: str,
        plan: dict[str, Any],
        specs: Iterable[EnvironmentSpec],
        created_at: str,
        hosts: list[str],
        notes: list[str],
    ) -> None:
        doc = {
            "schema": CAMPAIGN_SCHEMA,
            "campaign": cid,
            "created_at": created_at,
            "hosts": hosts,
            "notes": notes,
            "plan": plan,
            "environments": [s.model_dump(mode="json") for s in specs],
        }
        cdir = self.campaign_dir(cid)
        # msgspec: the same JSON (indent 1) ten times faster than json's pure-Python indenting
        text = msgspec.json.format(msgspec.json.encode(doc), indent=1) + b"\n"
        files = {CAMPAIGN_FILE: text, PLAN_FILE: (cdir / PLAN_FILE).read_bytes()}
        signature = expansion_document(cid, files, self.signer)
        write_atomic(cdir / CAMPAIGN_FILE, text)
        write_atomic(cdir / EXPANSION_SIG_FILE, signature)

    def existing_campaign_dir(self, campaign_id: str) -> Path:
        """A stored campaign's directory; StoreError saying what is missing if there is none."""
        cdir = self.campaign_dir(campaign_id)
        if not self.root.is_dir():
            what = "is not a directory" if self.root.exists() else "does not exist"
            raise StoreError(
                f"data directory {self.root} {what}: give --data the directory that holds your "
                "campaigns"
            )
        if not cdir.is_dir():
            known = ", ".join(self.campaign_ids()[-5:]) or "none"
            raise StoreError(f"no campaign '{campaign_id}' under {self.root} (recent: {known})")
        return cdir

    def _campaign_file(self, campaign_id: str) -> Path:
        path = self.existing_campaign_dir(campaign_id) / CAMPAIGN_FILE
        if not path.exists():
            known = ", ".join(self.campaign_ids()[-5:]) or "none"
            raise StoreError(f"no campaign '{campaign_id}' under {self.root} (recent: {known})")
        return path

    def campaign_view(self, campaign_id: str) -> CampaignView:
        """The stored campaign as the report reads it (header, planned identities), fast."""
        path = self._campaign_file(campaign_id)
        try:
            return campaign_view(path.read_bytes())
        except msgspec.MsgspecError as exc:
            raise StoreError(f"{path} is not a campaign file: {exc}") from exc

    def load_campaign(self, campaign_id: str) -> Campaign:
        """The stored campaign ``campaign_id``."""
        cdir = self.campaign_dir(campaign_id)
        path = self._campaign_file(campaign_id)
        try:
            doc = from_json(path.read_bytes())
            return Campaign(
                id=doc["campaign"],
                plan_text=(cdir / PLAN_FILE).read_text(),
                plan=doc["plan"],
                environments=doc["environments"],
                created_at=doc["created_at"],
                hosts=list(doc["hosts"]),
                notes=list(doc.get("notes", [])),
            )
        except (ValueError, KeyError, TypeError) as exc:  # not JSON, or not a campaign's
            raise StoreError(f"{path} is not a campaign file ({exc})") from exc

    @contextmanager
    def _campaign_locked(self, campaign_id: str) -> Iterator[Campaign]:
        with open(self.campaign_dir(campaign_id) / LOCK_FILE, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield self.load_campaign(campaign_id)

    def add_environments(self, campaign_id: str, specs: list[EnvironmentSpec]) -> None:
        """Add planned environments (a rerun's new attempt) to a stored campaign."""
        with self._campaign_locked(campaign_id) as c:
            known = c.spec_by_key()
            clash = [s.key() for s in specs if s.key() in known]
            if clash:
                raise StoreError(f"environments already planned: {', '.join(clash[:3])}")
            all_specs = c.specs + specs
            hosts = sorted({s.host for s in all_specs})
            self._write_campaign(c.id, c.plan, all_specs, c.created_at, hosts, c.notes)
        for host in hosts:
            self.host_dir(campaign_id, host).mkdir(parents=True, exist_ok=True)

    def set_task_ids(self, campaign_id: str, task_ids: dict[str, str]) -> None:
        """Record the task id of planned environments (environment key -> task id)."""
        with self._campaign_locked(campaign_id) as c:
            known = c.spec_by_key()
            missing = [k for k in task_ids if k not in known]
            if missing:
                raise StoreError(f"not planned in {campaign_id}: {', '.join(missing[:3])}")
            specs = [
                s.model_copy(update={"task_id": task_ids[s.key()]}) if s.key() in task_ids else s
                for s in c.specs
            ]
            self._write_campaign(c.id, c.plan, specs, c.created_at, c.hosts, c.notes)

    def set_task_id(self, campaign_id: str, env_key: str, task_id: str) -> None:
        """Record the task id of one planned environment."""
        self.set_task_ids(campaign_id, {env_key: task_id})

    def find_task(self, task_id: str) -> tuple[str, EnvironmentSpec]:
        """The campaign and planned environment of ``task_id`` (newest campaign first)."""
        for cid in reversed(self.campaign_ids()):
            for spec in self.load_campaign(cid).specs:
                if spec.task_id == task_id:
                    return cid, spec
        raise StoreError(f"no planned environment has task id '{task_id}' under {self.root}")

    def hosts(self, campaign_id: str) -> list[str]:
        """Hosts of a campaign: planned ones and any that delivered records."""
        planned = set(self.load_campaign(campaign_id).hosts)
        hosts_dir = self.campaign_dir(campaign_id) / "hosts"
        seen = (
            {p.name for p in hosts_dir.iterdir() if is_name(p.name)}
            if hosts_dir.is_dir()
            else set()
        )
        return sorted(planned | seen)

    # --- provenance and verification ------------------------------------------------------------
    def write_provenance(self, campaign_id: str, host: str, facts: dict[str, Any]) -> Path:
        """Store a host's provenance (replaces an earlier one; a finalized host's signed head
        is signed again over it)."""
        text = json.dumps(facts, indent=2, sort_keys=True, default=str) + "\n"
        return self.host_log(campaign_id, host).write_provenance(text.encode(), lambda: self.signer)

    def provenance(self, campaign_id: str, host: str) -> dict[str, Any]:
        """A host's stored provenance, or an empty dict."""
        path = self.host_dir(campaign_id, host) / PROVENANCE_FILE
        if not path.exists():
            return {}
        return _json_object(path, "restore it, or remove it to go on without this provenance")

    def write_verification(self, campaign_id: str, result: Mapping[str, object]) -> None:
        """Store the outcome of the last ``verify``, signed by this store's coordinator key
        (derived; rebuilt by every verify; ``coordinator.store.verdict`` checks it)."""
        path = self.campaign_dir(campaign_id) / VERIFICATION_FILE
        write_atomic(path, verdict_document(campaign_id, result, self.signer))

    def verification(self, campaign_id: str) -> dict[str, Any] | None:
        """The outcome of the last ``verify``, if any (StoreError if it is not readable)."""
        path = self.campaign_dir(campaign_id) / VERIFICATION_FILE
        if not path.exists():
            return None
        return _json_object(path, f"run 'sandbench verify {campaign_id}' to rebuild it")

    def signer_if_loaded(self) -> CoordinatorKey | None:
        """The coordinator key this store signs with, if it was given or loaded (none made)."""
        return self._signer

    def raw_digests(self, campaign_id: str) -> dict[str, str]:
        """SHA-256 of every file ``verify`` checks (the raw ones), by path in the campaign."""
        cdir = self.campaign_dir(campaign_id)
        names = [PLAN_FILE, CAMPAIGN_FILE, EXPANSION_SIG_FILE]
        for host in self._record_hosts(campaign_id):
            names += [f"hosts/{host}/{n}"
                      for n in (RECORDS_FILE, HEAD_FILE, LOST_FILE, PROVENANCE_FILE)]  # fmt: skip
        return {n: file_digest(cdir / n) for n in names if (cdir / n).exists()}

    # --- records ---------------------------------------------------------------------------------
    def host_log(self, campaign_id: str, host: str) -> HostLog:
        """The record log of ``host`` in ``campaign_id`` (kept: appends read only what is new)."""
        log = self._logs.get((campaign_id, host))  # names checked when the log was first made
        if log is None:
            path = self.records_path(campaign_id, host)
            log = self._logs[(campaign_id, host)] = HostLog(campaign_id, host, path)
        return log

    def append_record(self, record: EnvironmentRecord) -> bool:
        """Append ``record`` unless its (environment, attempt) is already stored; True if added."""
        return self.append_records([record]) == 1

    def append_records(
        self,
        records: list[EnvironmentRecord],
        objects: list[dict[str, Any]] | None = None,
        *,
        sync: bool = True,
    ) -> int:
        """Append every record whose key is absent (one host, one campaign); returns how many.

        ``objects``: the records' JSON objects as received, stored byte for byte as signed.
        ``sync=False``: the caller fsyncs the log (``hostlog.sync_file``) before it calls the
        records stored (a group commit over many hosts' logs).
        """
        if not records:
            return 0
        first = records[0]
        if any((r.campaign, r.host) != (first.campaign, first.host) for r in records):
            raise StoreError("append_records takes the records of one campaign and one host")
        if not self.campaign_dir(first.campaign).is_dir():
            raise StoreError(f"record for unknown campaign '{first.campaign}' under {self.root}")
        log = self.host_log(first.campaign, first.host)
        return log.append(records, self.signer, objects, sync=sync)

    def seal_host(self, campaign_id: str, host: str, planned: int) -> Path:
        """Sign the head of ``host``'s log at finalization, when its ``planned`` environments
        all have an outcome (line count, last digest, lost marks)."""
        return self.host_log(campaign_id, host).seal(self.signer, planned)

    def _record_hosts(self, campaign_id: str) -> list[str]:
        """Hosts that have a records directory (no need to parse campaign.json for that)."""
        hosts_dir = self.campaign_dir(campaign_id) / "hosts"
        if not hosts_dir.is_dir():
            return []
        return sorted(p.name for p in hosts_dir.iterdir() if p.is_dir() and is_name(p.name))

    def log_lines(self, campaign_id: str, host: str) -> list[bytes]:
        """Every line of ``host``'s records file as stored (a last line without newline too)."""
        path = self.records_path(campaign_id, host)
        if not path.exists():
            return []
        lines = path.read_bytes().split(b"\n")
        return lines[:-1] if lines[-1] == b"" else lines

    def record_lines(
        self, campaign_id: str, host: str | None = None
    ) -> Iterator[tuple[Path, int, bytes]]:
        """Every stored record line as bytes (file, line number, line), host by host; the file
        is streamed (never held whole in memory)."""
        for h in [host] if host else self._record_hosts(campaign_id):
            path = self.records_path(campaign_id, h)
            if not path.exists():
                continue
            with open(path, "rb") as f:
                for n, raw in enumerate(f, start=1):
                    line = raw[:-1] if raw.endswith(b"\n") else raw
                    if line.strip():
                        yield path, n, line

    def records(self, campaign_id: str, host: str | None = None) -> list[EnvironmentRecord]:
        """Every stored record of a campaign (or one host), in file order."""
        out = []
        for path, n, line in self.record_lines(campaign_id, host):
            try:  # bytes that are not UTF-8 replaced: the schema names what is wrong, not the codec
                text = line.decode("utf-8", errors="replace")
                out.append(EnvironmentRecord.model_validate_json(text))
            except ValidationError as exc:
                raise StoreError(
                    f"{path} line {n}: not a valid record ({exc.error_count()} errors); run "
                    f"'sandbench verify {campaign_id}'"
                ) from exc
        return out


def _json_object(path: Path, fix: str) -> dict[str, Any]:
    """The JSON object stored at ``path``; StoreError naming the file and ``fix`` otherwise."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise StoreError(f"{path} is not JSON ({exc}); {fix}") from exc
    if not isinstance(data, dict):
        raise StoreError(f"{path} is not a JSON object; {fix}")
    return data
