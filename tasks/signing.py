"""Host keys and record signatures: Ed25519 over the record's canonical JSON.

A host's key lives in ``$SANDBENCH_HOME/host.key`` (PKCS#8 PEM, mode 0600) with the host
name beside it in ``host.name``; the trusted registry of the coordinator is
``$SANDBENCH_HOME/hosts.json`` (see ``coordinator.registry``; ``tasks.paths`` defines the
home).

What is signed: every field of the record except ``signature`` and ``superseded`` (the latter
is derived by the coordinator from later attempts, never by the host), serialized by
``canonical_json``.
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

from tasks.errors import HostKeyError, RecordRejected
from tasks.names import check_name
from tasks.paths import sandbench_home
from tasks.records import EnvironmentRecord, Signature

KEY_FILE = "host.key"
NAME_FILE = "host.name"
UNSIGNED_FIELDS = ("signature", "superseded")
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


def canonical_json(obj: Any) -> bytes:
    """Deterministic UTF-8 JSON: sorted keys, no spaces, no NaN."""
    text = json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


def public_key_from_b64(text: str) -> Ed25519PublicKey:
    """An Ed25519 public key from its base64 raw 32-byte form."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        raise HostKeyError(
            f"'{text}' is not an Ed25519 public key (expected base64 of 32 bytes, as printed by "
            "'sandbench host init')"
        ) from exc


def fingerprint(public_b64: str) -> str:
    """Short fingerprint of a base64 public key, used in key ids."""
    return hashlib.sha256(base64.b64decode(public_b64)).hexdigest()[:FINGERPRINT_HEX]


class HostKey:
    """This host's name and Ed25519 signing key."""

    def __init__(self, name: str, private: Ed25519PrivateKey, path: Path | None = None) -> None:
        self.name = check_name(name, "host name")  # names a store directory and a queue
        self.private = private
        self.path = path

    @classmethod
    def generate(cls, name: str) -> HostKey:
        """A new key for host ``name``, not stored anywhere."""
        return cls(name, Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: Path) -> HostKey:
        """The key stored at ``path`` (host name from ``host.name`` beside it)."""
        path = Path(path)
        try:
            private = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise HostKeyError(
                f"{path}: cannot read the host key ({exc}); run 'sandbench host init'"
            ) from exc
        if not isinstance(private, Ed25519PrivateKey):
            raise HostKeyError(
                f"{path}: not an Ed25519 key; move it away and run 'sandbench host init'"
            )
        name_file = path.with_name(NAME_FILE)
        name = name_file.read_text().strip() if name_file.exists() else socket.gethostname()
        return cls(name, private, path)

    @classmethod
    def load_or_create(cls, path: Path | None = None, name: str | None = None) -> HostKey:
        """The key at ``path`` (default ``$SANDBENCH_HOME/host.key``), created if absent."""
        path = Path(path) if path is not None else default_key_path()
        if path.exists():
            key = cls.load(path)
            if name is not None and name != key.name:
                raise HostKeyError(
                    f"{path} belongs to host '{key.name}', not '{name}'; pass --host-name "
                    f"{key.name} or use another key path"
                )
            return key
        key = cls.generate(name or socket.gethostname())
        key.save(path)
        return key

    def save(self, path: Path) -> None:
        """Write the private key (mode 0600) and the host name beside it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        pem = self.private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        path.with_name(NAME_FILE).write_text(self.name + "\n")
        self.path = path

    def public_b64(self) -> str:
        """The public key as base64 of its 32 raw bytes (what ``hosts add`` takes)."""
        raw = self.private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return base64.b64encode(raw).decode("ascii")

    @property
    def key_id(self) -> str:
        """``<host>:<fingerprint>``: names the host and the key that signed a record."""
        return f"{self.name}:{fingerprint(self.public_b64())}"

    def sign(self, data: bytes) -> str:
        """Base64 Ed25519 signature of ``data``."""
        return base64.b64encode(self.private.sign(data)).decode("ascii")


def signed_payload(record: EnvironmentRecord) -> bytes:
    """The bytes a record's signature covers."""
    data = record.to_json_dict()
    for name in UNSIGNED_FIELDS:
        data.pop(name, None)
    return canonical_json(data)


def sign_record(record: EnvironmentRecord, key: HostKey) -> EnvironmentRecord:
    """A copy of ``record`` signed by ``key``; the record must name the key's host."""
    if record.host != key.name:
        raise HostKeyError(
            f"record of host '{record.host}' cannot be signed with the key of host '{key.name}'"
        )
    unsigned = record.model_copy(update={"signature": None})
    signature = Signature(key_id=key.key_id, ed25519=key.sign(signed_payload(unsigned)))
    return record.model_copy(update={"signature": signature})


def verify_record(
    record: EnvironmentRecord, registry: TrustedKeys, campaign: str | None = None
) -> None:
    """Raise ``RecordRejected`` unless ``record`` is signed by its own, registered host."""
    where = record.key()
    if campaign is not None and record.campaign != campaign:
        raise RecordRejected(f"{where}: belongs to campaign '{record.campaign}', not '{campaign}'")
    if record.signature is None:
        raise RecordRejected(f"{where}: record is not signed")
    signer, _, print_ = record.signature.key_id.partition(":")
    if signer != record.host:
        raise RecordRejected(
            f"{where}: host mismatch: signed by '{signer}', claims '{record.host}'"
        )
    if record.host not in registry.names():
        raise RecordRejected(
            f"{where}: unknown host '{record.host}'; register it with 'sandbench hosts add'"
        )
    public_b64 = registry.public_key(record.host)
    if print_ != fingerprint(public_b64):
        raise RecordRejected(
            f"{where}: signed by a key that is not the registered key of '{signer}'"
        )
    try:
        signature = base64.b64decode(record.signature.ed25519, validate=True)
        public_key_from_b64(public_b64).verify(signature, signed_payload(record))
    except (InvalidSignature, ValueError) as exc:
        raise RecordRejected(
            f"{where}: bad signature (the record was changed after signing)"
        ) from exc
