"""Signed specs: the coordinator key signs every spec it sends, a worker runs only those.

A spec's signature covers its canonical JSON (``contract.signing.canonical_json``) without the
``spec_signature`` field; ``coordinator_key`` (the signer's key id) is inside what is signed. A
worker trusts exactly one coordinator public key (``worker.config``) and refuses a spec that is
unsigned, signed by another key, or changed after signing, before anything of it runs.
"""

from __future__ import annotations

from typing import Any

from contract.errors import SpecRefused
from contract.records import EnvironmentSpec
from contract.signing import (
    SPEC_SIGNATURE_FIELD,
    CoordinatorKey,
    canonical_json,
    coordinator_key_id,
    signature_ok,
)


def spec_payload(data: dict[str, Any]) -> bytes:
    """The bytes a spec's signature covers, from the spec's JSON object."""
    return canonical_json({k: v for k, v in data.items() if k != SPEC_SIGNATURE_FIELD})


def signed_spec_data(spec: EnvironmentSpec, key: CoordinatorKey) -> dict[str, Any]:
    """``spec`` as the JSON object sent to a worker, signed by ``key``."""
    data = spec.model_dump(mode="json")
    data["coordinator_key"] = key.key_id
    data.pop(SPEC_SIGNATURE_FIELD, None)
    data[SPEC_SIGNATURE_FIELD] = key.sign(spec_payload(data))
    return data


def sign_spec(spec: EnvironmentSpec, key: CoordinatorKey) -> EnvironmentSpec:
    """A copy of ``spec`` signed by ``key``."""
    return EnvironmentSpec.model_validate(signed_spec_data(spec, key))


def check_spec(spec: EnvironmentSpec, trusted_b64: str | None, trusted_from: str) -> None:
    """Raise ``SpecRefused`` unless ``spec`` is signed by the coordinator key ``trusted_b64``.

    ``trusted_from`` names where the trusted key comes from (for the message).
    """
    where = spec.key()
    untrusted = "untrusted coordinator key"
    if trusted_b64 is None:
        raise SpecRefused(
            f"refused {where}: this worker trusts no coordinator key yet ({trusted_from}); "
            "install it with 'ops/install.sh --role worker --coordinator-key FILE' or "
            "'sandbench host trust-coordinator FILE'",
            untrusted,
        )
    if spec.spec_signature is None or spec.coordinator_key is None:
        raise SpecRefused(
            f"refused {where}: the spec is not signed by a coordinator key", "unsigned spec"
        )
    trusted_id = coordinator_key_id(trusted_b64)
    if spec.coordinator_key != trusted_id:
        raise SpecRefused(
            f"refused {where}: signed by {spec.coordinator_key}, but this worker trusts only "
            f"{trusted_id} ({trusted_from})",
            untrusted,
        )
    data = spec.model_dump(mode="json")
    if not signature_ok(trusted_b64, spec.spec_signature, spec_payload(data)):
        raise SpecRefused(
            f"refused {where}: bad spec signature (the spec was changed after the coordinator "
            "signed it, or forged)",
            "bad signature",
        )
