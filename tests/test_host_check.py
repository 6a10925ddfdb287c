"""sandbench host check on this host: every line named, ok or failed with the fix that mends it.

The v2 side (cgroup v2 with the controllers enabled down to a delegated service, the worker
refusing to start) runs inside the v2 host: tests/v2guest_quota.py through tests/test_v2host.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from contract.errors import HostCheckFailed
from contract.paths import DEFAULT_WORK_ROOT
from contract.records import Quota
from tests.conftest import REPO, require, require_binary
from worker import cgroups, hostcheck, hostcheck_tools, hostinfo
from worker.vm import accel, guest

JBD2 = Path("/proc/fs/jbd2")
NAMES = [
    "cgroup-version", "controllers", "delegation", "swap-accounting", "quota-cpus",
    "quota-memory", "quota-applies", "bubblewrap", "user-namespaces", "overlayfs", "dockerd",
    "kvm", "disk-space", "work-root-journal", "signing-key",
]  # fmt: skip


def host_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``sandbench host check ARGS`` as a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "coordinator", "host", "check", *args], cwd=REPO,
        env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def kvm_reason() -> str | None:
    """Why KVM is unusable here (the probe's reason), or None where it works."""
    prepared = guest.load_guest()
    require(guest.guest_problem(prepared) is None, f"prepared guest in {guest.vm_home()}")
    assert prepared is not None
    return accel.kvm_problem(prepared)


def has_journal(device: str) -> bool:
    """Whether the ext4 file system on ``device`` has a journal, as ``dumpe2fs`` reads it from
    the superblock (the check reads the kernel's view in /sys instead)."""
    dumpe2fs = require_binary("dumpe2fs")
    proc = subprocess.run([dumpe2fs, "-h", device], capture_output=True, text=True, check=True)
    features = next(x for x in proc.stdout.splitlines() if x.startswith("Filesystem features:"))
    return "has_journal" in features.split()


def expected_failures() -> set[str]:
    """The lines that fail here: KVM where it does not work, the journal line where the default
    work root is on ext4 without a journal (this machine's root file system): jbd2 lists no
    journal of its device (``/proc/fs/jbd2/<device>-<n>``; the device itself may be closed to
    us, as /dev/vda is here)."""
    failing = set() if kvm_reason() is None else {"kvm"}
    fs = hostinfo.filesystem_of(DEFAULT_WORK_ROOT)
    device = Path(fs["source"]).name
    journals = [p.name for p in Path("/proc/fs/jbd2").iterdir()] if JBD2.is_dir() else []
    if fs["type"] == "ext4" and not any(j.startswith(f"{device}-") for j in journals):
        failing.add("work-root-journal")
    return failing


def test_here_every_line_passes_but_kvm_and_the_journal() -> None:
    """Here the check names every line, says cgroup v1, fails KVM with the probe's reason and
    how to probe again, and the work root's journal where its ext4 has none; exits 1 for them
    (0 where nothing fails)."""
    require(cgroups.detect() == 1, "a cgroup v1 host (this machine)")
    reason = kvm_reason()
    proc = host_check("--json")
    doc = json.loads(proc.stdout)
    lines = {line["name"]: line for line in doc["checks"]}
    assert [line["name"] for line in doc["checks"]] == NAMES
    assert lines["cgroup-version"]["detail"].startswith("cgroup v1")
    assert lines["delegation"]["detail"].startswith("not needed on cgroup v1")
    assert "memory.memsw.limit_in_bytes" in lines["swap-accounting"]["detail"]
    assert "cpuset.cpus 0-1" in lines["quota-applies"]["detail"]
    failed = {name for name, line in lines.items() if not line["ok"]}
    assert failed == expected_failures(), {name: lines[name] for name in failed}
    assert set(doc["failed"]) == failed and proc.returncode == (1 if failed else 0)
    assert all(line["fix"] is None for line in doc["checks"] if line["ok"])
    if reason is None:
        return
    assert reason in lines["kvm"]["detail"] and "fall back to TCG" in lines["kvm"]["detail"]
    assert "sandbench vm prepare" in lines["kvm"]["fix"] and accel.CACHE_FILE in lines["kvm"]["fix"]


def test_the_journal_line_follows_the_work_roots_file_system(
    ext4_images: dict[bool, Path],
) -> None:
    """A work root on ext4 with a journal passes; one without fails, saying why creates slow down
    after deletions there and how to give a journaled work root; the host facts say which."""
    with_journal = hostcheck_tools.journal_check(ext4_images[True] / "work")
    assert with_journal.ok and with_journal.detail.startswith("ext4 with a journal on ")
    without = hostcheck_tools.journal_check(ext4_images[False] / "work")
    assert not without.ok and without.detail.startswith(f"{hostinfo.NO_JOURNAL} on ")
    assert "30 s" in without.detail and "--work-root" in without.fix
    assert "tune2fs -O has_journal" in without.fix
    for journal, mount in ext4_images.items():
        source = hostinfo.filesystem_of(mount)["source"]
        assert has_journal(source) is journal  # what the superblock says
        assert hostinfo.host_facts(mount, {})["work_root_journal"] == (
            "ext4 with a journal" if journal else hostinfo.NO_JOURNAL
        )
    tmpfs = hostcheck_tools.journal_check(Path("/dev/shm"))
    assert tmpfs.ok and tmpfs.detail.startswith("tmpfs on ")


def test_text_output_puts_the_fix_under_a_failed_line(tmp_path: Path) -> None:
    """Without --json each line reads ok or FAIL with its name; a failed one has its fix below,
    and the last line counts them (a fresh home: no key, no prepared guest)."""
    proc = host_check(env={"SANDBENCH_HOME": str(tmp_path)})
    out = proc.stdout.splitlines()
    assert proc.returncode == 1, proc.stderr
    key_line = next(i for i, line in enumerate(out) if line.split()[1:2] == ["signing-key"])
    assert out[key_line].startswith("FAIL") and f"no host key at {tmp_path}" in out[key_line]
    assert out[key_line + 1].strip() == "fix: sandbench host init"
    assert out[-1].startswith("host check: ") and "signing-key" in out[-1]
    assert {line.split()[1] for line in out[:-1] if line[:2] in ("ok", "FA")} == set(NAMES)


def test_a_quota_this_host_cannot_apply_names_its_fix() -> None:
    """A quota naming CPUs this host lacks, or more memory than it has, fails those lines with
    what to change, and the worker's start check refuses it naming them."""
    online = (hostcheck.CPU_SYSFS / "online").read_text().strip()
    quota = Quota(cpus="0-511", cpu_quota=1.0, memory_bytes=1 << 50)
    lines = {line.name: line for line in hostcheck.quota_checks(quota)}
    assert not lines["quota-cpus"].ok and "do not exist" in lines["quota-cpus"].detail
    assert f"online here: {online}" in lines["quota-cpus"].fix
    assert not lines["quota-memory"].ok and "smaller quota.memory" in lines["quota-memory"].fix
    assert not lines["quota-applies"].ok and "cpuset.cpus" in lines["quota-applies"].detail
    assert lines["controllers"].ok and lines["cgroup-version"].ok
    with pytest.raises(HostCheckFailed, match=r"quota-cpus: .*fix: give the plan"):
        hostcheck.require_quota(quota)
    assert hostcheck.require_quota(Quota())  # the default quota applies here


def test_a_small_work_root_fails_disk_space(tmp_path: Path) -> None:
    """A work root on a 64 MiB tmpfs fails the disk-space line, naming --work-root, while
    overlayfs still mounts there."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)],
                             capture_output=True, text=True, check=False)  # fmt: skip
    require(mounted.returncode == 0, f"mounting a tmpfs (root): {mounted.stderr.strip()}")
    try:
        disk = hostcheck_tools.disk_check(small / "work")
        overlay = hostcheck_tools.overlayfs_check(small / "work")
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert not disk.ok and "tmpfs" in disk.detail and "--work-root DIR" in disk.fix
    assert overlay.ok, overlay.detail


def test_an_installed_harness_names_the_commit_install_sh_recorded(tmp_path: Path) -> None:
    """A harness run from a venv without a git tree names the commit recorded at install time."""
    site = tmp_path / "site"  # the packages as pip installs them: no .git above them
    for package in ("coordinator", "worker", "contract", "workloads"):
        shutil.copytree(
            REPO / package, site / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    deps = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    env = {**os.environ, "PYTHONPATH": f"{site}:{deps}"}
    name = [str(venv / "bin" / "python"), "-c",
            "from worker.provenance import harness_commit; print(harness_commit())"]  # fmt: skip

    def named() -> str:
        return subprocess.run(
            name, env=env, cwd=tmp_path, capture_output=True, text=True, check=True
        ).stdout

    assert named().strip() == "unknown"  # nothing recorded yet, and no git tree
    record = [str(venv / "bin" / "python"), "-m", "coordinator", "host", "harness-commit",
              "--repo", str(REPO), "--record"]  # fmt: skip
    printed = subprocess.run(
        record, env=env, cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert printed.strip().removesuffix("-dirty") == head
    assert named() == printed  # the installed harness names what install.sh recorded
    assert (venv / "sandbench-commit").read_text() == printed
    other = subprocess.run([*record[:-3], "--repo", str(tmp_path), "--record"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, check=True)  # fmt: skip
    assert other.stdout.strip() == "unknown"  # not a repository: nothing recorded over it
    assert named() == printed


def test_a_wheelhouse_commit_comes_before_the_repository(tmp_path: Path) -> None:
    """``--wheels DIR`` names the commit the wheelhouse was built from; a bad file is ignored."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    argv = [sys.executable, "-m", "coordinator", "host", "harness-commit", "--repo", str(REPO),
            "--wheels", str(wheels)]  # fmt: skip
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    built = "0123456789abcdef0123456789abcdef01234567"
    for text, named in ((f"{built}\n", built), ("not a commit\n", head)):
        (wheels / "sandbench-commit").write_text(text)
        out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True).stdout
        assert out.strip().removesuffix("-dirty") == named
