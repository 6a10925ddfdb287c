"""The gate: admission (host, signed spec, allowlist), preflight verdicts per campaign, the rule,
harness errors, signing."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from contract.errors import SpecRefused
from contract.records import NOT_RUN_RULE, EnvironmentSpec, NotRun, not_run_kind
from contract.signing import CoordinatorKey, HostKey, verify_record
from contract.spec_signing import sign_spec
from coordinator.store.trust import HostRegistry
from worker.config import Allowlist
from worker.gate import HostState, RecordedFailures, run_planned

HOST = "lab-a"
COORDINATOR = CoordinatorKey.generate()


def _spec(work_root: Path, **fields: object) -> EnvironmentSpec:
    values: dict[str, object] = {
        "campaign": "c-20261201-9a7e",
        "host": HOST,
        "mode": "native",
        "workload": "publish",
        "env_index": 0,
        "scale": 0.02,
        "rounds": 1,
        "limit_s": 30,
        "work_root": str(work_root / "planned"),
    }
    values.update(fields)
    return sign_spec(EnvironmentSpec.model_validate(values), COORDINATOR)


def _resigned(spec: EnvironmentSpec, **fields: object) -> EnvironmentSpec:
    """``spec`` with ``fields`` changed, signed again by the coordinator."""
    return sign_spec(spec.model_copy(update=fields), COORDINATOR)


@pytest.fixture
def host(tmp_path: Path) -> HostState:
    """This host's state with a fresh key and a private work root."""
    root = tmp_path / "work"
    root.mkdir()
    return HostState(HostKey.generate(HOST), root, coordinator=COORDINATOR.public_b64())


def test_a_spec_for_another_host_is_refused_before_it_runs(host: HostState) -> None:
    """A spec planned for another host raises SpecRefused: no record, nothing prepared."""
    spec = _spec(host.work_root, host="lab-b")
    with pytest.raises(SpecRefused, match="is for host lab-b, this is lab-a"):
        run_planned(spec, host, RecordedFailures())
    assert list(host.work_root.iterdir()) == []


def test_unsigned_forged_and_foreign_specs_are_refused_before_anything_runs(
    host: HostState, tmp_path: Path
) -> None:
    """An unsigned spec, one changed after signing and one signed by another key: refused."""
    marker = tmp_path / "ran"
    options = {"template": f"touch {marker}; exec {{payload_argv}}"}
    signed = _spec(host.work_root, mode="sneaky", mode_options=options)
    unsigned = signed.model_copy(update={"spec_signature": None, "coordinator_key": None})
    changed = _spec(host.work_root).model_copy(update={"mode": "sneaky", "mode_options": options})
    foreign = sign_spec(unsigned, CoordinatorKey.generate())
    for spec, reason in ((unsigned, "not signed"), (changed, "bad spec signature"),
                         (foreign, "this worker trusts only")):  # fmt: skip
        with pytest.raises(SpecRefused, match=reason):
            run_planned(spec, host, RecordedFailures())
    untrusting = HostState(host.key, host.work_root)
    with pytest.raises(SpecRefused, match="trusts no coordinator key"):
        run_planned(signed, untrusting, RecordedFailures())
    assert not marker.exists() and list(host.work_root.iterdir()) == []


def test_a_fleet_worker_runs_only_the_command_modes_its_own_file_allows(
    host: HostState, tmp_path: Path
) -> None:
    """A signed command mode the worker's allowlist lacks is preflight failed; allowed, it runs."""
    marker = tmp_path / "ran"
    options = {"template": f"touch {marker}; exec {{payload_argv}}"}
    config = tmp_path / "worker.toml"
    host.allowlist = lambda: Allowlist(config, frozenset({"other"}))
    record = run_planned(_spec(host.work_root, mode="wrapped", mode_options=options), host,
                         RecordedFailures())  # fmt: skip
    assert record is not None and record.outcome == "not-run" and record.reason is not None
    assert f'add the line allowed_command_modes = ["other", "wrapped"] to {config}' in record.reason
    assert not marker.exists()
    host.allowlist = lambda: Allowlist(config, frozenset({"wrapped"}))
    again = _spec(host.work_root, mode="wrapped", mode_options=options, campaign="c-20261201-0c0c")
    record = run_planned(again, host, RecordedFailures())
    assert record is not None and record.outcome == "passed", record.detail
    assert marker.exists()


def test_a_passed_record_is_signed_and_ran_under_the_hosts_work_root(
    host: HostState, tmp_path: Path
) -> None:
    """The runner ran under the host's work root (not the planned one); the record verifies."""
    record = run_planned(_spec(host.work_root), host, RecordedFailures())
    assert record is not None and record.outcome == "passed", record
    registry = HostRegistry(tmp_path / "hosts.json")
    registry.add(HOST, host.key.public_b64())
    verify_record(record, registry)
    assert (host.work_root / "fixtures").is_dir() and not (host.work_root / "planned").exists()


def test_preflight_is_asked_once_per_campaign_and_mode(host: HostState, tmp_path: Path) -> None:
    """A missing runtime: preflight not-runs for the whole campaign; a new campaign asks again."""
    runtime = tmp_path / "runtime"
    options = {"template": [str(runtime), "{payload_argv}"]}
    first = _spec(host.work_root, mode="late-runtime", mode_options=options)
    record = run_planned(first, host, RecordedFailures())
    assert record is not None and record.reason is not None
    assert not_run_kind(record.outcome, record.reason) is NotRun.PREFLIGHT
    runtime.write_text('#!/bin/sh\nexec "$@"\n')
    runtime.chmod(runtime.stat().st_mode | stat.S_IXUSR)
    again = run_planned(_resigned(first, env_index=1), host, RecordedFailures())
    assert again is not None and again.outcome == "not-run"  # the campaign's verdict holds
    later = run_planned(_resigned(first, campaign="c-20261201-0b0b"), host,
                        RecordedFailures())  # fmt: skip
    assert later is not None and later.outcome == "passed", later.detail
    assert len(host.verdicts) == 2


def test_the_rule_skips_what_follows_a_failure_and_only_that(host: HostState) -> None:
    """After a failure at order 1, order 2 of the cell is not run; order 0 and other cells run."""
    failures = RecordedFailures()
    bad = {"template": ["/bin/false", "{payload_argv}"]}
    failed = run_planned(_spec(host.work_root, mode="bad", mode_options=bad, order_index=1),
                         host, failures)  # fmt: skip
    assert failed is not None and failed.outcome == "failed"
    skipped = _spec(host.work_root, mode="bad", mode_options=bad, env_index=1, order_index=2)
    record = run_planned(skipped, host, failures)
    assert record is not None and (record.outcome, record.reason) == ("not-run", NOT_RUN_RULE)
    earlier = _spec(host.work_root, mode="bad", mode_options=bad, env_index=2, order_index=0)
    record = run_planned(earlier, host, failures)
    assert record is not None and record.outcome == "failed"  # planned before the failure


def test_a_harness_error_becomes_a_failed_record(host: HostState) -> None:
    """A spec the runner cannot run (a workload it does not know) gives a signed failed record."""
    spec = _spec(host.work_root, workload="no-such-workload")
    failures = RecordedFailures()
    record = run_planned(spec, host, failures)
    assert record is not None and record.signature is not None
    assert (record.outcome, record.reason) == ("failed", "launcher-error")
    assert record.detail is not None and "harness error on lab-a: WorkloadError" in record.detail
    assert failures.failed_before(spec.model_copy(update={"order_index": 1}))


def test_a_stop_before_the_environment_gives_no_record(host: HostState) -> None:
    """A stop requested before the run leaves no record (a resume runs it again) and no files."""
    stop = threading.Event()
    stop.set()
    assert run_planned(_spec(host.work_root), host, RecordedFailures(), stop=stop) is None
    assert not (host.work_root / "envs").exists() or not os.listdir(host.work_root / "envs")
