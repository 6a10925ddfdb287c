"""The tamper suite: every way of changing a campaign's bytes or a worker's orders is caught.

Real campaigns (native mode, tiny scale) run with ``sandbench run`` and through a real
two-worker fleet; each tampering is made on a copy of a stored campaign and must make
``sandbench verify`` exit 1 naming the reason (and the environment where one is concerned),
while verify and report leave every raw file of the store byte for byte as it was.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contract.app import COORDINATOR_QUEUE, TASK_RUN, TASK_STORE, create_app, host_queue
from contract.records import SCHEMA_VERSION
from contract.signing import CoordinatorKey
from contract.spec_signing import signed_spec_data
from coordinator.store.store import Store
from coordinator.store.trust import HostRegistry
from tests.fleet_helpers import (
    Fleet,
    dispatch,
    make_fleet,
    status,
    wait_finished,
    wait_until,
    write_plan,
)

__all__ = ["make_fleet"]  # the fixture

HOST = "lab-test"
PLAN = """
name = "tamper"
seed = 3
scale = 0.02
environments = 3
rounds = 1
workloads = ["publish", "seq-write"]
modes = ["native"]
sentinel = false
"""
RAW = ("plan.toml", "campaign.json", "campaign.sig", "hosts/*/records.jsonl",
       "hosts/*/head.json", "hosts/*/lost.jsonl", "hosts/*/provenance.json")  # fmt: skip
RUN_TIMEOUT_S = 300


class Lab:
    """One machine's private host key, registry and store, driven through the CLI."""

    def __init__(self, root: Path) -> None:
        self.root, self.data, self.work = root, root / "data", root / "work"
        self.key, self.registry = root / "home" / "host.key", root / "home" / "hosts.json"

    def sandbench(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``sandbench ARGS`` as a subprocess."""
        return subprocess.run([sys.executable, "-m", "coordinator", *args], capture_output=True,
                              text=True, timeout=RUN_TIMEOUT_S)  # fmt: skip

    def run(self, *args: str, data: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``sandbench run`` with this lab's key, registry and work root."""
        return self.sandbench("run", *args, "--data", str(data or self.data), "--work-root",
                              str(self.work), "--key", str(self.key), "--registry",
                              str(self.registry), "--host-name", HOST, "--no-progress")  # fmt: skip

    def verify(self, data: Path, cid: str) -> subprocess.CompletedProcess[str]:
        """``sandbench verify`` against this lab's registry."""
        return self.sandbench("verify", cid, "--data", str(data), "--registry", str(self.registry))


def campaign_id(stdout: str) -> str:
    """The id on the last line of ``run`` or ``dispatch``."""
    m = re.fullmatch(r"campaign: (\S+)", stdout.strip().splitlines()[-1])
    assert m, stdout[-2000:]
    return m.group(1)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> tuple[Lab, str, str]:
    """Two finished embedded campaigns of one small plan: the one tampered with, and another."""
    lab = Lab(tmp_path_factory.mktemp("tamper"))
    plan = lab.root / "plan.toml"
    plan.write_text(PLAN)
    ids = []
    for _ in range(2):
        out = lab.run(str(plan))
        assert out.returncode == 0 and "records: verified" in out.stdout, out.stdout + out.stderr
        ids.append(campaign_id(out.stdout))
    return lab, ids[0], ids[1]


def raw_files(cdir: Path) -> dict[str, bytes]:
    """Every raw file of a stored campaign by path: what nothing may change."""
    return {str(p.relative_to(cdir)): p.read_bytes() for pattern in RAW for p in cdir.glob(pattern)}


def copy_of(lab: Lab, cid: str, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of stored campaign ``cid`` in a data directory of its own; (data, campaign dir)."""
    data = tmp_path / "data"
    shutil.copytree(lab.data / cid, data / cid)
    return data, data / cid


def records_path(cdir: Path, host: str = HOST) -> Path:
    """The records file of ``host`` in a campaign directory."""
    return cdir / "hosts" / host / "records.jsonl"


def lines_of(cdir: Path) -> list[bytes]:
    """The record lines of the campaign's host."""
    return records_path(cdir).read_bytes().splitlines()


def key_of(line: bytes) -> str:
    """The environment key of a record line."""
    d = json.loads(line)
    return "/".join(str(d[p]) for p in ("campaign", "host", "mode", "workload", "env_index",
                                         "attempt"))  # fmt: skip


def assert_detected(lab: Lab, data: Path, cid: str, *expected: tuple[str, str | None]) -> str:
    """verify exits 1 with each (reason, environment) on one problem line; verify and report
    change no raw file. The verify output."""
    before = raw_files(data / cid)
    out = lab.verify(data, cid)
    assert out.returncode == 1, out.stdout + out.stderr
    problems = [line for line in out.stdout.splitlines() if line.startswith("problem: ")]
    for reason, key in expected:
        hits = [p for p in problems if reason in p and (key is None or key in p)]
        assert hits, f"no problem names {reason!r} for {key}:\n{out.stdout}"
    assert re.search(r": (UNVERIFIED|incomplete)", out.stdout), out.stdout
    report = lab.sandbench("report", cid, "--data", str(data), "--quiet")
    if report.returncode == 2:  # a line that is no record: the report names verify, builds nothing
        assert f"run 'sandbench verify {cid}'" in report.stderr, report.stderr
    else:
        assert report.returncode == 0 and "records: verified" not in report.stdout, report
    assert raw_files(data / cid) == before, "verify or report changed a raw file"
    return out.stdout


def _edit_line(cdir: Path, index: int, change: Callable[[bytes], bytes]) -> str:
    """Replace record line ``index`` by ``change(line)``; the environment key of that line."""
    lines = lines_of(cdir)
    key = key_of(lines[index])
    before, lines[index] = lines[index], change(lines[index])
    assert lines[index] != before, "the tampering changed nothing: the test would prove nothing"
    records_path(cdir).write_bytes(b"\n".join(lines) + b"\n")
    return key


def _first_number(line: bytes, field: bytes) -> bytes:
    """``line`` with the first digit of ``field``'s number changed."""
    at = line.index(b'"' + field + b'":') + len(field) + 3
    digit = line[at : at + 1]
    return line[:at] + (b"2" if digit != b"2" else b"3") + line[at + 1 :]


def test_an_untouched_campaign_verifies_and_its_report_says_so(
    lab: tuple[Lab, str, str], tmp_path: Path
) -> None:
    """An untouched copy verifies (exit 0); its report then says verified; no raw file changes."""
    lb, cid, _ = lab
    data, cdir = copy_of(lb, cid, tmp_path)
    before = raw_files(cdir)
    out = lb.verify(data, cid)
    assert out.returncode == 0 and f"campaign {cid}: verified (6 records" in out.stdout, out.stdout
    report = lb.sandbench("report", cid, "--data", str(data), "--quiet")
    assert "records: verified" in report.stdout and "records: verified" in (
        cdir / "report.md").read_text()  # fmt: skip
    assert raw_files(cdir) == before


def _delete(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    lines = lines_of(cdir)
    gone, after = key_of(lines[2]), key_of(lines[3])
    records_path(cdir).write_bytes(b"\n".join(lines[:2] + lines[3:]) + b"\n")
    return [
        ("1 record(s) missing before it (seq 3-3 removed)", after),
        ("planned but has no record, and host lab-test's log was finalized", gone),
    ]


def _truncate(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    lines = lines_of(cdir)
    records_path(cdir).write_bytes(b"\n".join(lines[:-2]) + b"\n")
    return [
        ("removed tail: the log was finalized with 6 records and ends at seq 4", None),
        ("planned but has no record, and host lab-test's log was finalized", key_of(lines[-1])),
    ]


def _cut_mid_line(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    data = records_path(cdir).read_bytes()
    records_path(cdir).write_bytes(data[:-40])
    return [("not a valid record: not JSON", None), ("removed tail", None)]


def _reorder(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    lines = lines_of(cdir)
    lines[1], lines[2] = lines[2], lines[1]
    records_path(cdir).write_bytes(b"\n".join(lines) + b"\n")
    return [
        ("out of order (seq 3 before seq 2): reordered", key_of(lines[1])),
        ("out of order (seq 2 after seq 3)", key_of(lines[2])),
    ]


def _duplicate(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    lines = lines_of(cdir)
    records_path(cdir).write_bytes(b"\n".join(lines[:2] + lines[1:]) + b"\n")
    return [("duplicate of line 2", key_of(lines[1]))]


def _edit_number(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    key = _edit_line(cdir, 1, lambda line: _first_number(line, b"task_s"))
    return [("bad signature (the record was changed after signing)", key)]


def _number_to_string(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    key = _edit_line(cdir, 1, lambda line: re.sub(rb'"task_s":([0-9.e-]+)', rb'"task_s":"\1"',
                                                  line, count=1))  # fmt: skip
    return [("not a valid record: rounds.0.task_s: Input should be a valid number", key)]


def _extra_space(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    key = _edit_line(cdir, 4, lambda line: line.replace(b',"workload":', b', "workload":', 1))
    return [("does not round-trip byte for byte", key)]


def _duplicate_key(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    twice = b'{"attempt":1,"attempt":1,'
    key = _edit_line(cdir, 0, lambda line: line.replace(b'{"attempt":1,', twice, 1))
    return [("names the key 'attempt' twice", key)]


def _old_schema(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    now = f'"schema":{SCHEMA_VERSION},'.encode()
    key = _edit_line(cdir, 0, lambda line: line.replace(now, b'"schema":2,', 1))
    return [(f"record(s) of an older schema than {SCHEMA_VERSION} (first: line 1)", key)]


def _mark_superseded(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    key = _edit_line(
        cdir, 3, lambda line: line.replace(b'"superseded":false', b'"superseded":true')
    )
    return [("marked superseded, which neither a host nor the store ever writes", key)]


def _edit_campaign(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    path = cdir / "campaign.json"
    path.write_bytes(path.read_bytes().replace(b'"rounds": 1', b'"rounds": 2', 1))
    return [("campaign.json: changed after the coordinator signed it", None)]


def _edit_plan(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    with open(cdir / "plan.toml", "a") as f:
        f.write("# an innocent comment\n")
    return [("plan.toml: changed after the coordinator signed it", None)]


def _replay(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    foreign = lines_of(other)[2]
    _edit_line(cdir, 2, lambda line: foreign)
    return [((f"belongs to campaign '{other.name}', not '{cdir.name}' (a record replayed from "
             "another campaign)"), key_of(foreign))]  # fmt: skip


def _replay_appended(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    foreign = lines_of(other)[0]
    with open(records_path(cdir), "ab") as f:
        f.write(foreign + b"\n")
    return [("a record replayed from another campaign", key_of(foreign))]


def _unseal_and_truncate(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    (cdir / "hosts" / HOST / "head.json").unlink()
    records_path(cdir).write_bytes(b"\n".join(lines_of(cdir)[:-1]) + b"\n")
    return []  # no line to blame: the campaign is incomplete, never verified


def _edit_provenance(cdir: Path, other: Path) -> list[tuple[str, str | None]]:
    path = cdir / "hosts" / HOST / "provenance.json"
    facts = json.loads(path.read_bytes())
    assert facts["cpu_model"], facts
    facts["cpu_model"] = "a faster CPU than it ran on"
    path.write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
    return [(f"hosts/{HOST}/provenance.json: provenance changed after finalization", None)]


TAMPERINGS: dict[str, Callable[[Path, Path], list[tuple[str, str | None]]]] = {
    "delete": _delete, "truncate": _truncate, "cut-mid-line": _cut_mid_line,
    "reorder": _reorder, "duplicate": _duplicate, "edit-number": _edit_number,
    "number-to-string": _number_to_string, "extra-space": _extra_space,
    "duplicate-key": _duplicate_key, "old-schema": _old_schema, "superseded": _mark_superseded,
    "edit-campaign-json": _edit_campaign, "edit-plan": _edit_plan, "replay": _replay,
    "replay-appended": _replay_appended, "unseal-and-truncate": _unseal_and_truncate,
    "edit-provenance": _edit_provenance,
}  # fmt: skip


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_each_tampering_is_detected_by_name_and_nothing_is_lost(
    lab: tuple[Lab, str, str], tmp_path: Path, name: str
) -> None:
    """A tampered copy makes verify exit 1 naming the reason and environment; no raw file moves."""
    lb, cid, other = lab
    data, cdir = copy_of(lb, cid, tmp_path)
    expected = TAMPERINGS[name](cdir, lb.data / other)
    out = assert_detected(lb, data, cid, *expected)
    if name == "unseal-and-truncate":
        assert f"campaign {cid}: incomplete: 1 planned without a record" in out, out


def test_report_of_changed_bytes_is_unverified_and_run_exits_1(
    lab: tuple[Lab, str, str], tmp_path: Path
) -> None:
    """After a verified campaign's record changes, report says unverified (naming the file) and
    'run --resume' re-verifies it and exits 1."""
    lb, cid, _ = lab
    data, cdir = copy_of(lb, cid, tmp_path)
    assert lb.verify(data, cid).returncode == 0
    _edit_number(cdir, cdir)
    report = lb.sandbench("report", cid, "--data", str(data), "--quiet")
    changed = f"unverified: hosts/{HOST}/records.jsonl changed since the last verify"
    assert changed in report.stdout and changed in (cdir / "report.md").read_text(), report.stdout
    before = raw_files(cdir)
    resumed = lb.run("--resume", cid, data=data)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert "records: UNVERIFIED (1 problems in 6 records)" in resumed.stdout, resumed.stdout
    assert raw_files(cdir) == before


def test_a_forged_verdict_is_not_shown_as_verified(
    lab: tuple[Lab, str, str], tmp_path: Path
) -> None:
    """Edited records with their new SHA-256 written into verification.json (or an unsigned
    verdict): report says unverified, naming verification.json's signature, never verified."""
    lb, cid, _ = lab
    data, cdir = copy_of(lb, cid, tmp_path)
    assert lb.verify(data, cid).returncode == 0
    _edit_number(cdir, cdir)
    path = cdir / "verification.json"
    doc = json.loads(path.read_bytes())
    name = f"hosts/{HOST}/records.jsonl"
    doc["digests"][name] = hashlib.sha256(records_path(cdir).read_bytes()).hexdigest()
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    report = lb.sandbench("report", cid, "--data", str(data), "--quiet")
    forged = "records: unverified: verification.json: bad coordinator signature"
    assert report.returncode == 0 and forged in report.stdout, report.stdout + report.stderr
    assert forged in (cdir / "report.md").read_text()
    assert "records: verified" not in (cdir / "report.md").read_text() + report.stdout
    for field in ("key_id", "ed25519"):  # a verdict as an older verify wrote it: unsigned
        doc.pop(field)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    report = lb.sandbench("report", cid, "--data", str(data), "--quiet")
    assert "records: unverified: verification.json: not signed" in report.stdout, report.stdout


def test_a_refused_report_replaces_the_stale_one(lab: tuple[Lab, str, str], tmp_path: Path) -> None:
    """A verified report on disk, then a line that is no record: report exits 2, says on stderr
    that report.md and report.html were replaced, and neither says verified any more."""
    lb, cid, _ = lab
    data, cdir = copy_of(lb, cid, tmp_path)
    assert lb.verify(data, cid).returncode == 0
    built = lb.sandbench("report", cid, "--data", str(data), "--quiet")
    assert "records: verified" in (cdir / "report.md").read_text(), built.stdout + built.stderr
    with open(records_path(cdir), "ab") as f:
        f.write(b"not a record\n")
    report = lb.sandbench("report", cid, "--data", str(data), "--quiet")
    assert report.returncode == 2 and len(report.stderr.splitlines()) == 1, report.stderr
    assert "line 7: not a valid record" in report.stderr, report.stderr
    assert "the earlier report.md and report.html now say only that no report" in report.stderr
    for page in ("report.md", "report.html"):
        text = (cdir / page).read_text()
        assert "verified" not in text.replace(f"sandbench verify {cid}", ""), text
        assert "no report" in text and "line 7: not a valid record" in text, text


def test_a_copy_verifies_elsewhere_once_its_keys_are_registered(
    lab: tuple[Lab, str, str], tmp_path: Path
) -> None:
    """On a machine that trusts neither key verify names the untrusted coordinator key; after
    'hosts add' of the host and 'hosts add --coordinator' it verifies."""
    lb, cid, _ = lab
    data, _ = copy_of(lb, cid, tmp_path)
    elsewhere = ["--data", str(data), "--registry", str(tmp_path / "elsewhere.json")]
    out = lb.sandbench("verify", cid, *elsewhere)
    assert out.returncode == 1 and "not a coordinator key" in out.stdout, out.stdout
    assert "sandbench hosts add --coordinator NAME PUBKEY" in out.stdout
    trusted = HostRegistry(lb.registry)
    reg = ["--registry", str(tmp_path / "elsewhere.json")]
    lb.sandbench("hosts", "add", HOST, trusted.public_key(HOST), *reg)
    (coordinator,) = (e["public_key"] for e in trusted.coordinators().values())
    added = lb.sandbench("hosts", "add", "their-lab", coordinator, "--coordinator", *reg)
    assert added.returncode == 0 and "added: coordinator key" in added.stdout, added.stderr
    again = lb.sandbench("verify", cid, *elsewhere)
    assert again.returncode == 0 and "verified" in again.stdout, again.stdout


# --- the fleet: forged specs, command modes, another host's record --------------------------------
FORBIDDEN = "not-allowed"  # a command mode the lab hosts' worker.toml does not name


def _forged_specs(fleet: Fleet, campaign: str, marker: Path) -> dict[str, dict[str, Any]]:
    """Three specs for lab-a whose command template would create ``marker``: unsigned, signed
    by another coordinator key, and signed then changed."""
    planned = Store(fleet.data).load_campaign(campaign).host_specs("lab-a")[0]
    evil = planned.model_copy(update={
        "env_index": 90, "mode": "evil", "task_id": None,
        "mode_options": {"template": f"touch {marker}; exec {{payload_argv}}"}})  # fmt: skip
    unsigned = evil.model_dump(mode="json")
    foreign = signed_spec_data(evil.model_copy(update={"env_index": 91}), CoordinatorKey.generate())
    changed = signed_spec_data(planned.model_copy(update={"env_index": 92}), fleet.coordinator_key)
    changed["mode_options"] = evil.mode_options
    return {"unsigned": unsigned, "foreign key": foreign, "changed after signing": changed}


def _send_forged(fleet: Fleet, specs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Send each spec to lab-a's queue as the broker password allows; each task's outcome."""
    app = create_app(fleet.redis.url())
    try:
        results = {name: app.send_task(TASK_RUN, args=[spec], queue=host_queue("lab-a"))
                   for name, spec in specs.items()}  # fmt: skip
        for r in results.values():
            wait_until(lambda r=r: r.ready(), 60, "the forged spec's task to finish")
        return {name: f"{r.state}: {r.result}" for name, r in results.items()}
    finally:
        app.close()


@pytest.mark.fleet
def test_fleet_refuses_forged_specs_and_unallowed_command_modes(
    make_fleet: Any, tmp_path: Path
) -> None:
    """Two real workers: forged specs fail before anything runs, a command mode their own file
    does not allow is preflight failed, the campaign verifies, and another host's record or a
    removed one in the store is detected."""
    fleet = make_fleet(["lab-a", "lab-b"])
    fleet.register_hosts()
    for name in fleet.hosts:
        fleet.start_worker(name)
    fleet.start_coordinator()
    marker = tmp_path / "ran-as-root"
    template = f"touch {marker}; exec {{payload_argv}}"
    plan = write_plan(tmp_path / "plan.toml", environments=1, rounds=1, workloads=["publish"],
                      modes=["native", {"name": FORBIDDEN, "template": template}],
                      sentinel=False)  # fmt: skip
    campaign = dispatch(fleet, plan, "lab-a,lab-b")
    wait_finished(fleet, campaign)
    store = Store(fleet.data)
    refused = [r for r in store.records(campaign) if r.mode == FORBIDDEN]
    assert len(refused) == 2 and all(r.outcome == "not-run" for r in refused), refused
    for r in refused:
        toml = fleet.hosts[r.host].home / "worker.toml"
        assert "add the line allowed_command_modes = [" in str(r.reason), r.reason
        assert f'"{FORBIDDEN}"' in str(r.reason) and str(toml) in str(r.reason), r.reason
    verified = fleet.cli("verify", campaign, "--data", str(fleet.data))
    assert verified.returncode == 0 and "verified" in verified.stdout, verified.stdout
    before, count = raw_files(fleet.data / campaign), len(store.records(campaign))
    outcomes = _send_forged(fleet, _forged_specs(fleet, campaign, marker))
    assert "not signed by a coordinator key" in outcomes["unsigned"], outcomes
    assert "but this worker trusts only" in outcomes["foreign key"], outcomes
    assert "bad spec signature" in outcomes["changed after signing"], outcomes
    assert all(o.startswith("FAILURE: refused ") for o in outcomes.values()), outcomes
    assert not marker.exists(), "a forged or unallowed template ran"
    assert len(store.records(campaign)) == count and raw_files(fleet.data / campaign) == before
    assert "(nothing ran, no record)" in fleet.workers["lab-a"].text()
    _assert_superseded_on_the_wire_rejected(fleet, campaign)
    assert raw_files(fleet.data / campaign) == before
    _assert_fleet_store_tampering_detected(fleet, campaign, tmp_path)


def _assert_superseded_on_the_wire_rejected(fleet: Fleet, campaign: str) -> None:
    """A genuine record sent again marked superseded (a field no signature covers) is rejected."""
    record = json.loads(records_path(fleet.data / campaign, "lab-b").read_bytes().splitlines()[0])
    record.pop("chain")
    record["superseded"] = True
    app = create_app(fleet.redis.url())
    try:
        app.send_task(TASK_STORE, args=[record], queue=COORDINATOR_QUEUE)
    finally:
        app.close()
    wait_until(lambda: status(fleet, campaign)["rejected"] == 1, 60, "the record's rejection")
    assert "a record sent as superseded" in (fleet.coordinator.text() if fleet.coordinator else "")


def _assert_fleet_store_tampering_detected(fleet: Fleet, campaign: str, tmp_path: Path) -> None:
    """In a copy of the fleet's store: lab-a's first record moved into lab-b's log is named."""
    data = tmp_path / "copy"
    shutil.copytree(fleet.data / campaign, data / campaign)
    a, b = records_path(data / campaign, "lab-a"), records_path(data / campaign, "lab-b")
    moved = a.read_bytes().splitlines()[0]
    a.write_bytes(b"\n".join(a.read_bytes().splitlines()[1:]) + b"\n")
    b.write_bytes(moved + b"\n" + b.read_bytes())
    before = raw_files(data / campaign)
    out = fleet.cli("verify", campaign, "--data", str(data))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"{key_of(moved)}: a record of host 'lab-a' stored under host 'lab-b'" in out.stdout
    assert "removed tail" in out.stdout or "missing before it" in out.stdout, out.stdout
    assert raw_files(data / campaign) == before
