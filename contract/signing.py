"""Ed25519 keys and signatures: host keys sign records, the coordinator key signs what it sends.

A host's key lives in ``$SANDBENCH_HOME/host.key`` (PKCS#8 PEM, mode 0600) with the host
name beside it in ``host.name``; the coordinator's in ``$SANDBENCH_HOME/coordinator.key``. The
trusted registry of the coordinator is ``$SANDBENCH_HOME/hosts.json`` (see
``coordinator.store.trust``; ``contract.paths`` defines the home); a worker trusts one coordinator
public key (``worker.config``).

What a record's host signature covers: the record's JSON object without ``signature``,
``superseded`` (derived by the coordinator from later attempts) and ``chain`` (the store's
link, signed by the coordinator), serialized by ``canonical_json``. Verification works on the
object as it was parsed from the wire or the stored line, never on a re-validated model, so a
number turned into a string or a dropped field changes the bytes checked. What a spec's
signature covers: the spec's JSON object without ``spec_signature``, ``coordinator_key``
included.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from contract.errors import HostKeyError, RecordRejected
from contract.names import check_name
from contract.paths import sandbench_home
from contract.records import EnvironmentRecord, Signature

KEY_FILE = "host.key"
NAME_FILE = "host.name"
COORDINATOR_KEY_FILE = "coordinator.key"
COORDINATOR_SIGNER = "coordinator"  # key ids of the coordinator key: coordinator:<fingerprint>
UNSIGNED_FIELDS = ("signature", "superseded", "chain")
SPEC_SIGNATURE_FIELD = "spec_signature"
FINGERPRINT_HEX = 16  # hex digits of the public key's SHA-256 in a key id


class TrustedKeys(Protocol):
    """The hosts whose records are accepted (the coordinator's registry implements it)."""

    def names(self) -> list[str]:
        """Trusted host names."""
        ...

    def public_key(self, name: str) -> str:
        """The base64 public key trusted for host ``name``."""
        ...


def default_key_path() -> Path:
    """Where this host's private key lives unless a command names another path."""
    return sandbench_home() / KEY_FILE


def default_coordinator_key_path() -> Path:
    """Where this machine's coordinator key lives unless a command names another path."""
    return sandbench_home() / COORDINATOR_KEY_FILE


def canonical_json(obj: Any) -> bytes:
    """Deterministic UTF-8 JSON: sorted keys, no spaces, no NaN."""
    text = json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


def sha256_hex(data: bytes) -> str:
    """SHA-256 of ``data`` as hex (line digests, file digests)."""
    return hashlib.sha256(data).hexdigest()


def public_key_from_b64(text: str) -> Ed25519PublicKey:
    """An Ed25519 public key from its base64 raw 32-byte form."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        raise HostKeyError(
            f"'{text}' is not an Ed25519 public key (expected base64 of 32 bytes, as printed by "
            "'sandbench host init' or 'sandbench coordinator init')"
        ) from exc


def fingerprint(public_b64: str) -> str:
    """Short fingerprint of a base64 public key, used in key ids."""
    return hashlib.sha256(base64.b64decode(public_b64)).hexdigest()[:FINGERPRINT_HEX]


def signature_ok(public_b64: str, signature_b64: object, data: bytes) -> bool:
    """Whether ``signature_b64`` is the Ed25519 signature of ``data`` by ``public_b64``."""
    try:
        signature = base64.b64decode(str(signature_b64), validate=True)
        public_key_from_b64(public_b64).verify(signature, data)
    except (InvalidSignature, ValueError, HostKeyError):
        return False
    return True


def _read_private(path: Path, fix: str) -> Ed25519PrivateKey:
    """The Ed25519 private key stored at ``path`` (``fix`` says how to make one)."""
    try:
        private = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise HostKeyError(f"{path}: cannot read the key ({exc}); {fix}") from exc
    if not isinstance(private, Ed25519PrivateKey):
        raise HostKeyError(f"{path}: not an Ed25519 key; move it away and {fix}")
    return private


def _write_private(private: Ed25519PrivateKey, path: Path) -> bool:
    """Store ``private`` at ``path`` (mode 0600) unless a key is there; False if one was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )  # fmt: skip
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)  # atomic, and never over a key another process made meanwhile
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    return True


class _Key:
    """An Ed25519 private key and where it is stored."""

    def __init__(self, private: Ed25519PrivateKey, path: Path | None = None) -> None:
        self.private = private
        self.path = path

    def public_b64(self) -> str:
        """The public key as base64 of its 32 raw bytes (what ``hosts add`` takes)."""
        raw = self.private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return base64.b64encode(raw).decode("ascii")

    def sign(self, data: bytes) -> str:
        """Base64 Ed25519 signature of ``data``."""
        return base64.b64encode(self.private.sign(data)).decode("ascii")


class HostKey(_Key):
    """This host's name and Ed25519 signing key."""

    def __init__(self, name: str, private: Ed25519PrivateKey, path: Path | None = None) -> None:
        super().__init__(private, path)
        self.name = check_name(name, "host name")  # names a store directory and a queue

    @classmethod
    def generate(cls, name: str) -> HostKey:
        """A new key for host ``name``, not stored anywhere."""
        return cls(name, Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: Path) -> HostKey:
        """The key stored at ``path`` (host name from ``host.name`` beside it)."""
        path = Path(path)
        private = _read_private(path, "run 'sandbench host init'")
        name_file = path.with_name(NAME_FILE)
        name = name_file.read_text().strip() if name_file.exists() else socket.gethostname()
        return cls(name, private, path)

    @classmethod
    def load_or_create(cls, path: Path | None = None, name: str | None = None) -> HostKey:
        """The key at ``path`` (default ``$SANDBENCH_HOME/host.key``), created if absent."""
        path = Path(path) if path is not None else default_key_path()
        if not path.exists():
            key = cls.generate(name or socket.gethostname())
            if key.save(path):
                return key
        found = cls.load_if_present(path, name)  # another process may have saved one first
        assert found is not None
        return found

    @classmethod
    def load_if_present(cls, path: Path | None = None, name: str | None = None) -> HostKey | None:
        """The key at ``path`` (default as ``load_or_create``), which must be host ``name``'s if
        one is given; None if there is none. Writes nothing."""
        path = Path(path) if path is not None else default_key_path()
        if not path.exists():
            return None
        key = cls.load(path)
        if name is not None and name != key.name:
            raise HostKeyError(
                f"{path} belongs to host '{key.name}', not '{name}'; pass --host-name "
                f"{key.name} or use another key path"
            )
        return key

    def save(self, path: Path) -> bool:
        """Write the host name and the private key (mode 0600); False if a key was there."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            return False
        path.with_name(NAME_FILE).write_text(self.name + "\n")
        saved = _write_private(self.private, path)
        self.path = path if saved else self.path
        return saved

    @property
    def key_id(self) -> str:
        """``<host>:<fingerprint>``: names the host and the key that signed a record."""
        return f"{self.name}:{fingerprint(self.public_b64())}"


class CoordinatorKey(_Key):
    """The coordinator's Ed25519 key: signs the campaign's expansion, specs and record links."""

    @classmethod
    def generate(cls) -> CoordinatorKey:
        """A new coordinator key, not stored anywhere."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: Path | None = None) -> CoordinatorKey:
        """The key at ``path`` (default ``$SANDBENCH_HOME/coordinator.key``), created if absent."""
        path = Path(path) if path is not None else default_coordinator_key_path()
        if not path.exists():  # another process may win the race: its key is read back then
            _write_private(Ed25519PrivateKey.generate(), path)
        return cls(_read_private(path, "run 'sandbench coordinator init'"), path)

    @classmethod
    def load_if_present(cls, path: Path | None = None) -> CoordinatorKey | None:
        """The key at ``path`` (default as ``load_or_create``), or None; writes nothing."""
        path = Path(path) if path is not None else default_coordinator_key_path()
        if not path.exists():
            return None
        return cls(_read_private(path, "run 'sandbench coordinator init'"), path)

    @property
    def key_id(self) -> str:
        """``coordinator:<fingerprint>``: the key that signed a spec, link or expansion."""
        return coordinator_key_id(self.public_b64())


def coordinator_key_id(public_b64: str) -> str:
    """The key id of the coordinator key ``public_b64``."""
    return f"{COORDINATOR_SIGNER}:{fingerprint(public_b64)}"


# --- records -------------------------------------------------------------------------------------
def payload_of(data: dict[str, Any]) -> bytes:
    """The bytes a record's host signature covers, from the record's JSON object."""
    return canonical_json({k: v for k, v in data.items() if k not in UNSIGNED_FIELDS})


def signed_payload(record: EnvironmentRecord) -> bytes:
    """The bytes a record's signature covers."""
    return payload_of(record.to_json_dict())


def sign_record(record: EnvironmentRecord, key: HostKey) -> EnvironmentRecord:
    """A copy of ``record`` signed by ``key``; the record must name the key's host."""
    if record.host != key.name:
        raise HostKeyError(
            f"record of host '{record.host}' cannot be signed with the key of host '{key.name}'"
        )
    unsigned = record.model_copy(update={"signature": None, "chain": None})
    signature = Signature(key_id=key.key_id, ed25519=key.sign(signed_payload(unsigned)))
    return unsigned.model_copy(update={"signature": signature})


def verify_record(
    record: EnvironmentRecord, registry: TrustedKeys, campaign: str | None = None
) -> None:
    """Raise ``RecordRejected`` unless ``record`` is signed by its own, registered host."""
    verify_record_data(record.to_json_dict(), registry, campaign)


def record_key(data: dict[str, Any]) -> str:
    """The environment key of a record's JSON object (``?`` for a missing part)."""
    parts = ("campaign", "host", "mode", "workload", "env_index", "attempt")
    return "/".join(str(data.get(p, "?")) for p in parts)


def verify_record_data(
    data: dict[str, Any], registry: TrustedKeys, campaign: str | None = None
) -> None:
    """Raise ``RecordRejected`` unless the record object ``data`` is signed by its own host."""
    where, host = record_key(data), str(data.get("host"))
    if campaign is not None and data.get("campaign") != campaign:
        raise RecordRejected(f"{where}: belongs to campaign '{data.get('campaign')}', not "
                             f"'{campaign}' (a record replayed from another campaign)")  # fmt: skip
    signature = data.get("signature")
    if not isinstance(signature, dict) or not signature.get("key_id"):
        raise RecordRejected(f"{where}: record is not signed")
    signer, _, print_ = str(signature["key_id"]).partition(":")
    if signer != host:
        raise RecordRejected(f"{where}: host mismatch: signed by '{signer}', claims '{host}'")
    if host not in registry.names():
        raise RecordRejected(
            f"{where}: unknown host '{host}'; register it with 'sandbench hosts add'"
        )
    public_b64 = registry.public_key(host)
    if print_ != fingerprint(public_b64):
        raise RecordRejected(
            f"{where}: signed by a key that is not the registered key of '{signer}'"
        )
    if not signature_ok(public_b64, signature.get("ed25519"), payload_of(data)):
        raise RecordRejected(f"{where}: bad signature (the record was changed after signing)")
