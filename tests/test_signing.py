"""Host keys, the coordinator key, the trusted registry, record and spec signatures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from contract.errors import HostKeyError, RecordRejected, SpecRefused
from contract.records import EnvironmentRecord, EnvironmentSpec, RoundRecord
from contract.signing import CoordinatorKey, HostKey, canonical_json, sign_record, verify_record
from contract.spec_signing import check_spec, sign_spec
from coordinator.store.trust import HostRegistry
from tests.conftest import REPO


def _record(host: str = "lab-a", **fields: object) -> EnvironmentRecord:
    base: dict[str, object] = {
        "campaign": "c-20261129-ab12",
        "host": host,
        "mode": "native",
        "workload": "publish",
        "env_index": 0,
        "outcome": "passed",
        "ready_ms": 12.5,
        "rounds": [RoundRecord(k=1, task_s=0.25, validated=True)],
    }
    base.update(fields)
    return EnvironmentRecord.model_validate(base)


def _trusting(tmp_path: Path, *keys: HostKey) -> HostRegistry:
    reg = HostRegistry(tmp_path / "hosts.json")
    for key in keys:
        reg.add(key.name, key.public_b64())
    return reg


def test_canonical_json_is_order_independent() -> None:
    """Canonical JSON sorts keys and drops whitespace, so equal objects give equal bytes."""
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == canonical_json({"a": [1.5, "é"], "b": 1})
    assert canonical_json({"a": 1}) == b'{"a":1}'


def test_key_is_created_once_and_reloaded(tmp_path: Path) -> None:
    """load_or_create makes a 0600 key with the host name beside it and reloads the same key."""
    path = tmp_path / "home" / "host.key"
    first = HostKey.load_or_create(path, name="lab-a")
    again = HostKey.load_or_create(path)
    assert (again.name, again.public_b64(), again.key_id) == (
        first.name,
        first.public_b64(),
        first.key_id,
    )
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert first.key_id.startswith("lab-a:")
    with pytest.raises(HostKeyError, match="belongs to host 'lab-a'"):
        HostKey.load_or_create(path, name="lab-b")


def test_signed_record_verifies_and_survives_json(tmp_path: Path) -> None:
    """A signed record verifies after a JSON round trip, also with superseded changed."""
    key = HostKey.generate("lab-a")
    signed = sign_record(_record(), key)
    back = EnvironmentRecord.model_validate_json(json.dumps(signed.to_json_dict()))
    verify_record(back, _trusting(tmp_path, key))
    verify_record(back.model_copy(update={"superseded": True}), _trusting(tmp_path, key))


def test_tampered_unknown_and_mismatched_records_are_rejected(tmp_path: Path) -> None:
    """Changed fields, unregistered hosts, foreign keys and wrong campaigns are all rejected."""
    key_a, key_b = HostKey.generate("lab-a"), HostKey.generate("lab-b")
    reg = _trusting(tmp_path, key_a)
    signed = sign_record(_record(), key_a)
    with pytest.raises(RecordRejected, match="bad signature"):
        verify_record(signed.model_copy(update={"ready_ms": 12.6}), reg)
    with pytest.raises(RecordRejected, match="unknown host"):
        verify_record(sign_record(_record("lab-b"), key_b), reg)
    with pytest.raises(RecordRejected, match="host mismatch"):
        verify_record(signed.model_copy(update={"host": "lab-b"}), _trusting(tmp_path, key_b))
    with pytest.raises(RecordRejected, match="campaign"):
        verify_record(signed, reg, campaign="c-20261129-zzzz")
    with pytest.raises(RecordRejected, match="not signed"):
        verify_record(_record(), reg)
    with pytest.raises(HostKeyError):
        sign_record(_record("lab-b"), key_a)


def test_registry_refuses_a_changed_key(tmp_path: Path) -> None:
    """Re-adding a host with its key is a no-op; another key for the same name is refused."""
    reg = HostRegistry(tmp_path / "hosts.json")
    key = HostKey.generate("lab-a")
    assert reg.add("lab-a", key.public_b64()) is True
    assert reg.add("lab-a", key.public_b64()) is False
    with pytest.raises(HostKeyError, match="another key"):
        reg.add("lab-a", HostKey.generate("lab-a").public_b64())
    with pytest.raises(HostKeyError, match="not an Ed25519 public key"):
        reg.add("lab-c", "not-base64!")
    assert reg.names() == ["lab-a"] and reg.public_key("lab-a") == key.public_b64()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator", *args], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_host_init_is_idempotent_and_hosts_add_list(tmp_path: Path) -> None:
    """`host init` makes one key and trusts it; again it changes nothing; `hosts add/list` work."""
    home = tmp_path / "home"
    first = _cli("host", "init", "--home", str(home), "--name", "lab-a")
    assert first.returncode == 0 and "new host key" in first.stdout
    key = (home / "host.key").read_bytes()
    quiet = _cli("host", "init", "--home", str(home), "--quiet")
    assert quiet.returncode == 0 and quiet.stdout == "" and (home / "host.key").read_bytes() == key
    pub = HostKey.load(home / "host.key").public_b64()
    reg = str(home / "hosts.json")
    other = HostKey.generate("lab-b").public_b64()
    assert "added: lab-b" in _cli("hosts", "add", "lab-b", other, "--registry", reg).stdout
    listed = _cli("hosts", "list", "--registry", reg).stdout
    assert f"lab-a  {pub}" in listed and f"lab-b  {other}" in listed
    bad = _cli("hosts", "add", "lab-b", HostKey.generate("x").public_b64(), "--registry", reg)
    assert bad.returncode == 2 and "already registered with another key" in bad.stderr


def test_host_init_exports_the_public_key_alone(tmp_path: Path) -> None:
    """`host init --export DIR` writes DIR/NAME.pub holding the public key and nothing private."""
    home, out = tmp_path / "home", tmp_path / "pubkeys" / "lab-a"
    done = _cli("host", "init", "--home", str(home), "--name", "lab-a", "--export", str(out))
    assert done.returncode == 0, done.stderr
    key = HostKey.load(home / "host.key")
    assert sorted(p.name for p in out.iterdir()) == ["lab-a.pub"]
    assert (out / "lab-a.pub").read_text() == key.public_b64() + "\n"
    assert (out / "lab-a.pub").stat().st_mode & 0o777 == 0o644


def test_changed_key_is_refused_naming_both_fingerprints_and_the_fix(tmp_path: Path) -> None:
    """Another key under a known name exits 2 with both fingerprints; --replace keeps the old."""
    reg = str(tmp_path / "hosts.json")
    old, new = HostKey.generate("lab-a"), HostKey.generate("lab-a")
    assert _cli("hosts", "add", "lab-a", old.public_b64(), "--registry", reg).returncode == 0
    refused = _cli("hosts", "add", "lab-a", new.public_b64(), "--registry", reg)
    assert refused.returncode == 2
    old_print, new_print = old.key_id.split(":")[1], new.key_id.split(":")[1]
    assert f"registered fingerprint {old_print}, presented {new_print}" in refused.stderr
    fix = f"sandbench hosts add --replace lab-a {new.public_b64()}"
    assert fix in refused.stderr
    assert HostRegistry(Path(reg)).public_key("lab-a") == old.public_b64()
    replaced = _cli(*fix.split()[1:], "--registry", reg)
    assert replaced.returncode == 0 and f"{old_print} -> {new_print}" in replaced.stdout
    entry = HostRegistry(Path(reg)).entries()["lab-a"]
    assert entry["public_key"] == new.public_b64()
    assert [r["public_key"] for r in entry["replaced"]] == [old.public_b64()]


def test_coordinator_init_makes_one_key_trusts_it_and_exports_the_public_half(
    tmp_path: Path,
) -> None:
    """`coordinator init --export` makes a 0600 key once, trusts it locally, exports it alone."""
    home, out = tmp_path / "home", tmp_path / "export"
    first = _cli("coordinator", "init", "--home", str(home), "--export", str(out))
    assert first.returncode == 0 and "new coordinator key" in first.stdout, first.stderr
    key = CoordinatorKey.load_or_create(home / "coordinator.key")
    assert os.stat(home / "coordinator.key").st_mode & 0o777 == 0o600
    assert (out / "coordinator.pub").read_text() == key.public_b64() + "\n"
    assert sorted(p.name for p in out.iterdir()) == ["coordinator.pub"]
    trusted = HostRegistry(home / "hosts.json").coordinators()
    assert list(trusted) == [key.key_id.split(":")[1]]
    again = _cli("coordinator", "init", "--home", str(home))
    assert "existing coordinator key" in again.stdout and key.key_id in again.stdout


def test_a_worker_trusts_one_coordinator_key_and_refuses_a_changed_one(tmp_path: Path) -> None:
    """`host trust-coordinator` installs a key; another exits 2 with both fingerprints."""
    old, new = CoordinatorKey.generate(), CoordinatorKey.generate()
    pub = tmp_path / "coordinator.pub"
    pub.write_text(old.public_b64() + "\n")
    home = ["--home", str(tmp_path / "worker")]
    assert _cli("host", "trust-coordinator", str(pub), *home).returncode == 0
    refused = _cli("host", "trust-coordinator", new.public_b64(), *home)
    old_print, new_print = old.key_id.split(":")[1], new.key_id.split(":")[1]
    assert refused.returncode == 2
    assert f"trusted fingerprint {old_print}, presented {new_print}" in refused.stderr
    assert (tmp_path / "worker" / "coordinator.pub").read_text().strip() == old.public_b64()
    replaced = _cli("host", "trust-coordinator", new.public_b64(), *home, "--replace")
    assert replaced.returncode == 0 and new_print in replaced.stdout


def test_a_spec_signature_covers_every_field_and_names_its_key() -> None:
    """A signed spec passes; any changed field, another key or no trusted key is refused."""
    key = CoordinatorKey.generate()
    planned = EnvironmentSpec(campaign="c-20261201-5a5a", host="lab-a", mode="native",
                              workload="publish", env_index=0, work_root="/w")  # fmt: skip
    spec = sign_spec(planned, key)
    check_spec(spec, key.public_b64(), "test")
    changes = {"mode_options": {"template": "id"}, "limit_s": 91.0, "host": "lab-b",
               "attempt": 2, "work_root": "/elsewhere"}  # fmt: skip
    for name, value in changes.items():
        with pytest.raises(SpecRefused, match="bad spec signature"):
            check_spec(spec.model_copy(update={name: value}), key.public_b64(), "test")
    with pytest.raises(SpecRefused, match="but this worker trusts only"):
        check_spec(spec, CoordinatorKey.generate().public_b64(), "test")
    with pytest.raises(SpecRefused, match="trusts no coordinator key"):
        check_spec(spec, None, "no file")


def _install(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """ops/install.sh --role worker under ``root`` (files only: no package, key or service)."""
    empty = root.parent / "no-password"
    empty.write_text("\n")
    argv = ["bash", str(REPO / "ops" / "install.sh"), "--role", "worker", "--host", "lab-a",
            "--broker", "redis://127.0.0.1:6379/0", "--password-file", str(empty), *args,
            "--root", str(root)]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_install_worker_trusts_the_coordinator_key_and_writes_its_allowlist(
    tmp_path: Path,
) -> None:
    """install.sh --role worker installs the coordinator key and the allowlist; it refuses no
    key, a malformed one and a changed one."""
    root, etc = tmp_path / "root", tmp_path / "root" / "etc" / "sandbench"
    missing = _install(root)
    assert missing.returncode == 2 and "--coordinator-key FILE is required" in missing.stderr
    bad = tmp_path / "bad.pub"
    bad.write_text("not-a-key\n")
    assert "is not an Ed25519 public key" in _install(root, "--coordinator-key", str(bad)).stderr
    key, other = CoordinatorKey.generate(), CoordinatorKey.generate()
    pub, changed = tmp_path / "coordinator.pub", tmp_path / "other.pub"
    pub.write_text(key.public_b64() + "\n")
    changed.write_text(other.public_b64() + "\n")
    done = _install(root, "--coordinator-key", str(pub), "--allow-command-modes", "gvisor,nsjail")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (etc / "coordinator.pub").read_text().strip() == key.public_b64()
    allowed = tomllib.loads((etc / "worker.toml").read_text())["allowed_command_modes"]
    assert allowed == ["gvisor", "nsjail"]
    again = _install(root, "--coordinator-key", str(changed))
    assert again.returncode == 2 and "already trusts another coordinator key" in again.stderr
    assert (etc / "coordinator.pub").read_text().strip() == key.public_b64()
