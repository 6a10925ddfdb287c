"""The trusted registry, one JSON file: host name -> Ed25519 public key, and coordinator keys.

``hosts`` holds each lab host's key (its records are accepted); ``coordinators`` holds, by
fingerprint, the coordinator keys whose signed expansions, record links and final heads
``verify`` accepts (this machine's own, registered when it is created, and any other
coordinator's whose campaigns are verified here).
"""

from __future__ import annotations

import copy
import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NotRequired, TypedDict

from contract.errors import HostKeyError
from contract.files import write_atomic
from contract.names import check_name
from contract.paths import sandbench_home
from contract.signing import CoordinatorKey, fingerprint, public_key_from_b64
from contract.stamps import utc_now

REGISTRY_FILE = "hosts.json"


class ReplacedKey(TypedDict):
    """A host key that another replaced (kept on file, for the record)."""

    public_key: str
    added_at: str
    replaced_at: str


class HostEntry(TypedDict):
    """A registered lab host: its base64 public key, when it was added, the keys it replaced."""

    public_key: str
    added_at: str
    replaced: NotRequired[list[ReplacedKey]]


class CoordinatorEntry(TypedDict):
    """A trusted coordinator key (by fingerprint in the file), when it was added, and whose."""

    public_key: str
    added_at: str
    label: str


class Registry(TypedDict):
    """The registry file: hosts by name, coordinator keys by fingerprint."""

    hosts: dict[str, HostEntry]
    coordinators: dict[str, CoordinatorEntry]


def default_registry_path() -> Path:
    """Where the trusted registry lives unless a command names another path."""
    return sandbench_home() / REGISTRY_FILE


class HostRegistry:
    """The hosts whose signed records the coordinator accepts."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_registry_path()
        self._cache: tuple[tuple[int, int, int], Registry] | None = None

    def _read(self) -> Registry:
        """The registry as stored (parsed again only when the file changed: verify asks per
        record). Callers that change it work on a copy."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return {"hosts": {}, "coordinators": {}}
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._cache is not None and self._cache[0] == stamp:
            return self._cache[1]
        try:
            data: Registry = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise HostKeyError(f"{self.path}: unreadable host registry ({exc})") from exc
        data.setdefault("hosts", {})
        data.setdefault("coordinators", {})
        self._cache = (stamp, data)
        return data

    def _read_for_change(self) -> Registry:
        """A fresh copy of the registry to change and write back (under the lock)."""
        self._cache = None
        return copy.deepcopy(self._read())

    def _write(self, data: Registry) -> None:
        write_atomic(self.path, json.dumps(data, indent=2, sort_keys=True) + "\n")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def add(self, name: str, pubkey_b64: str, *, replace: bool = False) -> bool:
        """Trust ``name`` with key ``pubkey_b64``; False if it was already registered so."""
        check_name(name, "host")
        public_key_from_b64(pubkey_b64)  # validates
        pubkey_b64 = pubkey_b64.strip()
        with self._locked():
            data = self._read_for_change()
            old = data["hosts"].get(name)
            if old is not None and old["public_key"] == pubkey_b64:
                return False
            if old is not None and not replace:
                raise self._changed_key(name, old["public_key"], pubkey_b64)
            added = utc_now()
            entry: HostEntry = {"public_key": pubkey_b64, "added_at": added}
            if old is not None:  # the replaced key stays on file, for the record
                gone = ReplacedKey(
                    public_key=old["public_key"], added_at=old["added_at"], replaced_at=added
                )
                entry["replaced"] = [*old.get("replaced", []), gone]
            data["hosts"][name] = entry
            self._write(data)
        return True

    def check(self, name: str, pubkey_b64: str | None) -> None:
        """The refusal ``add(name, pubkey_b64)`` would raise, raised without writing anything;
        ``pubkey_b64`` None is a key not made yet, which no registered key can be."""
        check_name(name, "host")
        entry = self._read()["hosts"].get(name)
        if entry is None or entry["public_key"] == (pubkey_b64 or "").strip():
            return
        if pubkey_b64 is not None:
            raise self._changed_key(name, entry["public_key"], pubkey_b64.strip())
        raise HostKeyError(
            f"host '{name}' is already registered with another key: registered fingerprint "
            f"{fingerprint(entry['public_key'])} ({self.path}), and this host has no key yet (a "
            "new one would be refused). Run with that host's key (--key), or as another host "
            "(--host-name)"
        )

    def add_coordinator(self, pubkey_b64: str, label: str = "coordinator") -> bool:
        """Trust coordinator key ``pubkey_b64`` (``label`` says whose); False if it already was."""
        public_key_from_b64(pubkey_b64)  # validates
        pubkey_b64 = pubkey_b64.strip()
        with self._locked():
            data = self._read_for_change()
            if fingerprint(pubkey_b64) in data["coordinators"]:
                return False
            added = utc_now()
            entry = CoordinatorEntry(public_key=pubkey_b64, added_at=added, label=label)
            data["coordinators"][fingerprint(pubkey_b64)] = entry
            self._write(data)
        return True

    def coordinator_key(self, fingerprint_: str) -> str | None:
        """The trusted coordinator public key with this fingerprint, if any."""
        entry = self._read()["coordinators"].get(fingerprint_)
        return None if entry is None else entry["public_key"]

    def coordinators(self) -> dict[str, CoordinatorEntry]:
        """Every trusted coordinator key by fingerprint."""
        return self._read()["coordinators"]

    def _changed_key(self, name: str, registered: str, presented: str) -> HostKeyError:
        """The refusal of another key under a registered name, with the command to replace it."""
        return HostKeyError(
            f"host '{name}' is already registered with another key: registered fingerprint "
            f"{fingerprint(registered)}, presented {fingerprint(presented)} ({self.path}). "
            "Refused: another machine may be answering under this name. If the host's key "
            f"really changed, replace it on purpose: sandbench hosts add --replace {name} "
            f"{presented}"
        )

    def public_key(self, name: str) -> str:
        """The registered base64 public key of ``name``."""
        entry = self._read()["hosts"].get(name)
        if entry is None:
            raise HostKeyError(
                f"host '{name}' is not in {self.path}; "
                f"add it with 'sandbench hosts add {name} PUBKEY'"
            )
        return entry["public_key"]

    def names(self) -> list[str]:
        """Registered host names, sorted."""
        return sorted(self._read()["hosts"])

    def entries(self) -> dict[str, HostEntry]:
        """Every registered host with its key, registration time and replaced keys."""
        return self._read()["hosts"]

    def __contains__(self, name: object) -> bool:
        return name in self._read()["hosts"]


def own_coordinator_key(
    path: Path | None = None, registry: HostRegistry | None = None
) -> CoordinatorKey:
    """This machine's coordinator key (created on first need), trusted by its own registry."""
    key = CoordinatorKey.load_or_create(path)
    home = (path or key.path or default_registry_path()).parent
    (registry or HostRegistry(home / REGISTRY_FILE)).add_coordinator(key.public_b64())
    return key
