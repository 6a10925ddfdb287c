"""The last ``verify``'s verdict as ``report`` and ``compare`` may show it: signed, and current.

``verify`` writes ``verification.json``: its verdict, its problems and the SHA-256 of every raw
file it checked (``Store.raw_digests``), for one campaign, signed by the coordinator key of the
machine that ran it (``coordinator.store.chain.verdict_document``). Anyone who can write the store
can write that file too, so its word counts only when a coordinator key the registry trusts,
this machine's own or the one this store signs with, signed it, for this campaign, and every
file it covers still has the digest it checked. Anything else reads ``unverified: why``: a
verdict that does not match is never shown as one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.errors import HostKeyError, StoreError
from contract.signing import COORDINATOR_SIGNER, CoordinatorKey, signature_ok
from coordinator.store.chain import VERDICT_FORMAT, signed_body
from coordinator.store.store import VERIFICATION_FILE, Store
from coordinator.store.trust import HostRegistry

UNVERIFIED = "unverified: "


@dataclass(frozen=True)
class Verdict:
    """What may be said of a campaign's records: verified, or why not."""

    verified: bool
    text: str  # "verified (...)", "unverified: why", "incomplete: ...", "not verified yet ..."

    @property
    def why(self) -> str:
        """Why it is not verified (the text without a leading ``unverified: ``)."""
        return self.text.removeprefix(UNVERIFIED)


def _machine_key() -> CoordinatorKey | None:
    """This machine's coordinator key if it has a readable one (none is made)."""
    try:
        return CoordinatorKey.load_if_present()
    except HostKeyError:
        return None


def _signer_problem(doc: dict[str, Any], store: Store, registry: HostRegistry) -> str | None:
    """Why ``doc`` is not signed by a trusted coordinator key, if it is not."""
    if "key_id" not in doc or "ed25519" not in doc:
        return "not signed (written by an older verify, or edited)"
    signer, _, print_ = str(doc["key_id"]).partition(":")
    public = registry.coordinator_key(print_) if signer == COORDINATOR_SIGNER else None
    for own in (store.signer_if_loaded(), _machine_key()):
        if public is None and own is not None and own.key_id == doc["key_id"]:
            public = own.public_b64()
    if public is None:
        return (f"signed by {doc['key_id']!r}, neither this machine's coordinator key nor one "
                f"{registry.path} trusts")  # fmt: skip
    if not signature_ok(public, doc["ed25519"], signed_body(doc)):
        return "bad coordinator signature (changed after verify signed it)"
    return None


def verdict_of(store: Store, campaign_id: str, registry: HostRegistry | None = None) -> Verdict:
    """The last ``verify``'s verdict if a trusted key signed it over these very bytes."""
    again = f"run 'sandbench verify {campaign_id}'"
    try:
        doc = store.verification(campaign_id)
    except StoreError:  # derived: verify writes it again
        return Verdict(False, f"{UNVERIFIED}{VERIFICATION_FILE} is unreadable ({again})")
    if doc is None:
        return Verdict(False, f"not verified yet ({again})")
    why = _signer_problem(doc, store, registry or HostRegistry())
    if why is None and (doc.get("campaign"), doc.get("format")) != (campaign_id, VERDICT_FORMAT):
        why = f"the verdict of campaign {doc.get('campaign')!r}, not {campaign_id}"
    if why is None and not isinstance(doc.get("digests"), dict):
        why = "names no digests"
    if why is not None:
        return Verdict(False, f"{UNVERIFIED}{VERIFICATION_FILE}: {why} ({again})")
    now, then = store.raw_digests(campaign_id), doc["digests"]
    changed = sorted(n for n in now.keys() | then.keys() if now.get(n) != then.get(n))
    if changed:
        return Verdict(False, f"{UNVERIFIED}{', '.join(changed[:3])} changed since the last "
                              f"verify ({again})")  # fmt: skip
    text = str(doc.get("verdict") or ("verified" if doc.get("ok") is True else "UNVERIFIED"))
    return Verdict(doc.get("ok") is True, text)
