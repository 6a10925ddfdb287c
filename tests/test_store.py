"""The campaign store: layout, idempotent append-only records, task ids, concurrent appenders."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from contract.errors import StoreError
from contract.records import EnvironmentRecord, EnvironmentSpec
from contract.signing import CoordinatorKey, sha256_hex
from coordinator.store.chain import genesis
from coordinator.store.store import Store

CID = "c-20261129-ab12"
SIGNER = CoordinatorKey.generate()  # the store signs campaign.json and every record link


def _specs(n: int = 4, host: str = "lab-a") -> list[EnvironmentSpec]:
    return [
        EnvironmentSpec(
            campaign=CID,
            host=host,
            mode="native",
            workload="publish",
            env_index=i,
            order_index=i,
            task_id=f"t{i}",
            work_root="/tmp/w",
        )
        for i in range(n)
    ]


def _store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "data", signer=SIGNER)
    store.create_campaign("name = 'x'\n", {"name": "x"}, _specs() + _specs(2, "lab-b"))
    return store


def _append_many(data: str, start: int) -> None:
    store = Store(data, signer=SIGNER)
    for i in range(40):
        spec = EnvironmentSpec(
            campaign=CID,
            host="lab-a",
            mode="native",
            workload="publish",
            env_index=(start + i) % 60,
            work_root="/tmp/w",
        )
        store.append_record(EnvironmentRecord.from_spec(spec, outcome="passed"))


def test_layout_and_campaign_round_trip(tmp_path: Path) -> None:
    """create_campaign writes plan, campaign and host dirs; load_campaign reads them back."""
    store = _store(tmp_path)
    cdir = tmp_path / "data" / CID
    assert (cdir / "plan.toml").read_text() == "name = 'x'\n"
    doc = json.loads((cdir / "campaign.json").read_text())
    assert len(doc["environments"]) == 6 and doc["hosts"] == ["lab-a", "lab-b"]
    c = store.load_campaign(CID)
    assert [s.key() for s in c.specs] == [s.key() for s in _specs() + _specs(2, "lab-b")]
    assert store.hosts(CID) == ["lab-a", "lab-b"]
    with pytest.raises(StoreError, match="already exists"):
        store.create_campaign("", {}, _specs())
    with pytest.raises(StoreError, match="no campaign"):
        store.load_campaign("c-19990101-0000")


def test_append_is_idempotent_and_append_only(tmp_path: Path) -> None:
    """A second record with the same (environment, attempt) is dropped; another attempt is kept."""
    store = _store(tmp_path)
    spec = _specs()[1]
    rec = EnvironmentRecord.from_spec(spec, outcome="passed", ready_ms=3.0)
    assert store.append_record(rec) is True
    assert Store(tmp_path / "data", signer=SIGNER).append_record(rec) is False  # fresh process view
    assert store.append_record(rec.model_copy(update={"ready_ms": 4.0})) is False
    assert store.append_record(rec.model_copy(update={"attempt": 2})) is True
    lines = store.records_path(CID, "lab-a").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["ready_ms"] == 3.0
    assert [r.attempt for r in store.records(CID, "lab-a")] == [1, 2]
    assert store.records(CID, "lab-b") == []


def test_concurrent_appenders_store_each_key_once(tmp_path: Path) -> None:
    """Four processes appending overlapping keys leave one line per key, in one hash chain."""
    store = _store(tmp_path)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(store.root), s)) for s in (0, 10, 20, 30)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    keys = [r.key() for r in store.records(CID, "lab-a")]
    assert len(keys) == len(set(keys)) == 60
    lines = store.log_lines(CID, "lab-a")
    prev = genesis(CID, "lab-a")
    for seq, line in enumerate(lines, start=1):  # one unbroken hash chain across the appenders
        chain = json.loads(line)["chain"]
        assert (chain["seq"], chain["prev"], chain["key_id"]) == (seq, prev, SIGNER.key_id)
        prev = sha256_hex(line)


def test_task_ids_provenance_and_reruns(tmp_path: Path) -> None:
    """Task ids map back to specs, provenance is stored per host, reruns add new attempts."""
    store = _store(tmp_path)
    store.set_task_id(CID, _specs()[2].key(), "celery-42")
    cid, spec = store.find_task("celery-42")
    assert cid == CID and spec.env_index == 2
    rerun = [s.model_copy(update={"attempt": 2, "task_id": None}) for s in _specs()]
    store.add_environments(CID, rerun)
    assert len(store.load_campaign(CID).specs) == 10
    with pytest.raises(StoreError, match="already planned"):
        store.add_environments(CID, rerun[:1])
    store.write_provenance(CID, "lab-a", {"kernel": "6.1"})
    assert store.provenance(CID, "lab-a") == {"kernel": "6.1"}
    with pytest.raises(StoreError, match="no planned environment"):
        store.find_task("nope")
