"""Planned versus recorded environments of a host: what is missing, lost or complete.

``coordinator.results.finalize`` finalizes a host once each planned environment has an outcome.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from contract.records import EnvironmentRecord, EnvironmentSpec
from coordinator.store.hostlog import LOST_FILE as LOST_FILE  # fleet.py reads it from here
from coordinator.store.hostlog import complete_lines, line_key
from coordinator.store.store import CAMPAIGN_FILE, Campaign, Store
from coordinator.store.views import PlannedView

log = logging.getLogger("sandbench.coordinator")


@dataclass
class HostProgress:
    """Planned versus received environments of one host in one campaign."""

    host: str
    planned_keys: frozenset[str]  # keys of the planned environments
    received: set[str]  # keys of stored records
    lost: dict[str, str] = field(default_factory=dict)  # env key -> reason
    records: dict[str, EnvironmentRecord] = field(default_factory=dict)  # when parsed
    specs: Callable[[], list[EnvironmentSpec]] = list  # the planned environments, validated

    @cached_property
    def planned(self) -> list[EnvironmentSpec]:
        """The planned environments in run order (validated on first need only)."""
        return self.specs()

    def keys(self) -> frozenset[str]:
        """Keys of the planned environments."""
        return self.planned_keys

    def missing(self) -> list[EnvironmentSpec]:
        """Planned environments with neither a record nor a lost mark, in run order."""
        done = self.received | self.lost.keys()
        return [s for s in self.planned if s.key() not in done]

    def complete(self) -> bool:
        """Whether every planned environment has an outcome."""
        planned = self.keys()
        return bool(planned) and counted(planned, self.received, self.lost.keys()) == len(planned)

    def fingerprint(self) -> str:
        """What finalization saw: records and lost marks counted (a change means finalize again)."""
        return fingerprint(self.keys(), self.received, self.lost.keys())


def counted(planned: AbstractSet[str], received: AbstractSet[str], lost: AbstractSet[str]) -> int:
    """How many ``planned`` environments have an outcome (a record or a lost mark)."""
    return len(planned & received) + len(planned & (lost - received))


def fingerprint(
    planned: AbstractSet[str], received: AbstractSet[str], lost: AbstractSet[str]
) -> str:
    """Records and lost marks of the ``planned`` environments counted, out of how many."""
    return f"{len(planned & received)}+{len(planned & (lost - received))}/{len(planned)}"


def received_keys(store: Store, path: Path) -> set[str]:
    """Keys of the records in ``path``, reading only what was appended since ``store`` last
    looked (its ``received_cache``)."""
    with store.cache_lock:
        return _received_keys(store.received_cache, path)


def _received_keys(cache: dict[Path, tuple[int, set[str]]], path: Path) -> set[str]:
    offset, keys = cache.get(path, (0, set()))
    size = path.stat().st_size if path.exists() else 0
    if size < offset:  # replaced: start over
        offset, keys = 0, set()
    if size > offset:
        for line in complete_lines(path, offset):  # streamed: never the whole file at once
            if line.strip():
                keys.add(line_key(line[:-1]))  # a few fields decoded: no model validation
            offset += len(line)
    cache[path] = (offset, keys)
    return set(keys)


def read_lost(path: Path) -> dict[str, str]:
    """Lost marks of one host: environment key -> reason."""
    if not path.exists():
        return {}
    lines = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {d["key"]: d["reason"] for d in lines}


class _Planned:
    """A stored campaign as read once per version of campaign.json: each host's planned keys
    from the fast view at once, the validated specs only when something needs them."""

    def __init__(self, store: Store, campaign: str, mtime: int) -> None:
        self.store, self.id, self.mtime = store, campaign, mtime
        view = store.campaign_view(campaign)
        self.views: dict[str, list[PlannedView]] = defaultdict(list)  # each host's, as stored
        for e in view.environments:
            self.views[e.host].append(e)
        self.hosts = list(view.hosts)
        self.keys = {h: frozenset(e.key() for e in v) for h, v in self.views.items()}
        self.all_keys = frozenset().union(*self.keys.values())
        self._campaign: Campaign | None = None
        self._raw: dict[str, list[dict[str, Any]]] | None = None
        self._specs: dict[str, list[EnvironmentSpec]] = {}
        self._lock = threading.Lock()  # the task thread and the sweep thread share it

    @property
    def campaign(self) -> Campaign:
        """The campaign, every spec validated (parsed on first need)."""
        with self._lock:
            if self._campaign is None:
                self._campaign = self.store.load_campaign(self.id)
            return self._campaign

    def host_keys(self, host: str) -> frozenset[str]:
        """Keys of ``host``'s planned environments."""
        return self.keys.get(host, frozenset())

    def host_specs(self, host: str) -> list[EnvironmentSpec]:
        """``host``'s planned environments in run order (only its own validated, once)."""
        if host not in self._specs:
            mine = self._raw_by_host().get(host, [])
            specs = [EnvironmentSpec.model_validate(e) for e in mine]
            self._specs[host] = sorted(specs, key=lambda s: s.order_index)
        return self._specs[host]

    def _raw_by_host(self) -> dict[str, list[dict[str, Any]]]:
        """The campaign's planned environments as stored (JSON), by host."""
        with self._lock:
            if self._raw is None:
                raw: dict[str, list[dict[str, Any]]] = defaultdict(list)
                for e in self.store.load_campaign(self.id).environments:
                    raw[str(e.get("host"))].append(e)
                self._raw = dict(raw)
            return self._raw


def _planned(store: Store, campaign: str) -> _Planned:
    """The read of ``campaign``'s campaign.json kept in ``store`` (read again only when the file
    changed)."""
    path = store.campaign_dir(campaign) / CAMPAIGN_FILE
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        store.load_campaign(campaign)  # raises the store's own error
        raise
    cached = store.progress_cache.get(campaign)
    if not isinstance(cached, _Planned) or cached.mtime != mtime:
        cached = store.progress_cache[campaign] = _Planned(store, campaign, mtime)
    return cached


def planned_keys(store: Store, campaign: str) -> frozenset[str]:
    """Keys of every environment planned in ``campaign`` (cached per version of the file)."""
    return _planned(store, campaign).all_keys


def planned_views(store: Store, campaign: str, host: str) -> list[PlannedView]:
    """The planned identities of ``host`` (fast views, cached per version of the file)."""
    return _planned(store, campaign).views.get(host, [])


def planned_hosts(store: Store, campaign: str) -> list[str]:
    """The hosts planned in ``campaign`` (cached per version of the file)."""
    return _planned(store, campaign).hosts


def load_campaign(store: Store, campaign: str) -> Campaign:
    """``store.load_campaign``, parsed again only when campaign.json changed."""
    return _planned(store, campaign).campaign


def host_progress(store: Store, campaign: str, host: str, *, parse: bool = False) -> HostProgress:
    """Planned versus received environments of ``host`` in ``campaign``, from the store.

    With ``parse`` every record is parsed (for status); otherwise only the keys appended since
    the last look are read (cheap enough to run for every stored record).
    """
    known = _planned(store, campaign)
    path = store.records_path(campaign, host)
    records = {r.key(): r for r in store.records(campaign, host)} if parse else {}
    received = set(records) if parse else received_keys(store, path)
    lost = read_lost(store.host_dir(campaign, host) / LOST_FILE)
    lost = {k: v for k, v in lost.items() if k not in received}
    return HostProgress(host, known.host_keys(host), received, lost, records,
                        lambda: known.host_specs(host))  # fmt: skip
