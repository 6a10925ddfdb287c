"""The host check's lines beyond the quota: sandboxes, overlayfs, dockerd, KVM, disk, the key.

``run_checks`` is the whole check (``sandbench host check``): the quota's lines from
``worker.hostcheck`` first, then these. Each reuses the part of sandbench it vouches for: the
sandbox and staged modes' preflights, the private dockerd's status, the VM accelerator probe's
cached verdict (``worker.vm.accel``), the host key's loader.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from contract.errors import HostKeyError
from contract.paths import DEFAULT_WORK_ROOT
from contract.records import Quota
from contract.signing import HostKey, default_key_path
from worker import hostinfo
from worker.dockerd import Dockerd, DockerdError
from worker.hostcheck import Check, failed, passed, quota_checks
from worker.modes.base import HostInfo
from worker.modes.sandbox import SandboxMode
from worker.modes.staged import StagedMode
from worker.vm import accel, guest

MIN_FREE_BYTES = 10 * 2**30  # the full preset's fixtures, workspaces, staged copies and images
USERNS_MAX = Path("/proc/sys/user/max_user_namespaces")
KVM_DEVICE = "/dev/kvm"
CGROUP_DRIVER = "cgroupfs"  # the private dockerd's (worker.dockerd), under our own cgroups
PROBE_TIMEOUT_S = 10.0
FIX_USERNS = (
    "sysctl -w user.max_user_namespaces=15000 (Debian < 11 also kernel.unprivileged_userns_clone=1"
    "; Ubuntu >= 23.10 also kernel.apparmor_restrict_unprivileged_userns=0), persisted in "
    "/etc/sysctl.d/"
)
FIX_KVM_DEVICE = (
    "enable VT-x/AMD-V in the firmware, modprobe kvm_intel (or kvm_amd), and run as root or a "
    "member of group kvm"
)


def bubblewrap_check() -> Check:
    """bubblewrap is installed and creates the sandbox mode's namespaces here."""
    verdict = SandboxMode().preflight(HostInfo())
    if verdict.ok:
        return passed("bubblewrap", f"{verdict.facts.get('bwrap')} creates the sandbox here")
    if shutil.which("bwrap") is None:
        return failed("bubblewrap", verdict.reason, "apt-get install bubblewrap (dnf: bubblewrap)")
    return failed("bubblewrap", verdict.reason, f"see user-namespaces; {FIX_USERNS}")


def userns_check() -> Check:
    """User namespaces are enabled and one can be created."""
    limit = USERNS_MAX.read_text().strip() if USERNS_MAX.exists() else "0"
    if limit == "0":
        return failed("user-namespaces", f"{USERNS_MAX} is 0", FIX_USERNS)
    try:
        probe = subprocess.run(
            ["unshare", "--user", "--map-root-user", "/bin/true"],
            capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return failed("user-namespaces", f"unshare --user failed: {exc}", FIX_USERNS)
    if probe.returncode != 0:
        why = probe.stderr.strip() or f"status {probe.returncode}"
        return failed("user-namespaces", f"unshare --user failed: {why}", FIX_USERNS)
    return passed("user-namespaces", f"enabled (at most {limit}); unshare --user works")


def overlayfs_check(work_root: Path) -> Check:
    """overlayfs mounts on the work root's file system (the staged mode's preflight)."""
    where = _existing(work_root)
    verdict = StagedMode().preflight(HostInfo(work_root=where))
    fs = hostinfo.filesystem_of(where)["type"]
    if verdict.ok:
        return passed("overlayfs", f"mounts on the work root's file system ({fs} at {where})")
    if "no overlayfs" in verdict.reason:
        return failed("overlayfs", verdict.reason, "modprobe overlay (persist: /etc/modules)")
    fix = "run as root, with the work root on ext4 or xfs (sandbench worker --work-root DIR)"
    return failed("overlayfs", f"{verdict.reason} (work root on {fs})", fix)


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing ancestor."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def dockerd_check() -> Check:
    """dockerd is installed; the private daemon, if it runs, uses the cgroupfs driver."""
    daemon = Dockerd()
    try:
        daemon.check_binary()
    except DockerdError as exc:
        return failed("dockerd", str(exc), "apt-get install docker.io (ops/setup.sh)")
    version = hostinfo.tool_version([daemon.dockerd, "--version"]) or daemon.dockerd
    status = daemon.status()
    if not status["running"]:
        idle = f"not running (the docker mode starts it with the {CGROUP_DRIVER} cgroup driver)"
        return passed("dockerd", f"{version}; the private dockerd is {idle}")
    driver, cgv = status.get("cgroup_driver"), status.get("cgroup_version")
    where = f"the private dockerd at {status['socket']}: cgroup driver {driver}, cgroup v{cgv}"
    if driver != CGROUP_DRIVER:
        fix = "sandbench host docker stop && sandbench host docker start"
        return failed("dockerd", f"{version}; {where} (needs {CGROUP_DRIVER})", fix)
    return passed("dockerd", f"{version}; {where}")


def kvm_check() -> Check:
    """/dev/kvm and the probe's verdict: KVM reaches Ready, or why the VM modes use TCG."""
    if not os.access(KVM_DEVICE, os.R_OK | os.W_OK):
        return failed("kvm", f"no usable {KVM_DEVICE}: the VM modes run under TCG", FIX_KVM_DEVICE)
    prepared = guest.load_guest()
    if (problem := guest.guest_problem(prepared)) or prepared is None:
        return failed("kvm", f"{KVM_DEVICE} opens, but no probe can boot: {problem}",
                      "sandbench vm prepare")  # fmt: skip
    problem = accel.kvm_problem(prepared)  # the cached verdict; else one bounded KVM probe
    verdict = accel.cached_verdict(prepared)
    summary = f" ({accel.probe_summary(verdict)})" if verdict else ""
    if problem is None:
        return passed("kvm", f"usable: the KVM probe reached Ready{summary}; the VM modes run "
                             f"with -accel kvm -cpu host")  # fmt: skip
    fix = (
        "check the host's KVM (dmesg | grep -i kvm; nested virtualization: "
        "/sys/module/kvm_intel/parameters/nested), then probe again: "
        f"rm {prepared.home / accel.CACHE_FILE} && sandbench vm prepare"
    )
    return failed("kvm", f"unusable: {problem}{summary}; the VM modes fall back to TCG", fix)


def disk_check(work_root: Path) -> Check:
    """The work root's file system has room for fixtures, workspaces and images."""
    where = _existing(work_root)
    free = shutil.disk_usage(where).free
    fs = hostinfo.filesystem_of(where)
    detail = f"{free / 2**30:.1f} GiB free on {fs['mount_point']} ({fs['type']}) for {work_root}"
    if free < MIN_FREE_BYTES:
        fix = (f"free space on {fs['mount_point']} (df -h {fs['mount_point']}), or give a work "
               f"root on a larger file system: --work-root DIR")  # fmt: skip
        return failed("disk-space", f"{detail}; needs {MIN_FREE_BYTES >> 30} GiB", fix)
    return passed("disk-space", detail)


def journal_check(work_root: Path) -> Check:
    """The work root's file system reuses freed inodes at once, so earlier environments'
    deletions do not slow later creates (ext4 without a journal fails this line)."""
    where = _existing(work_root)
    journal = hostinfo.work_root_journal(where)
    mount = hostinfo.filesystem_of(where)["mount_point"]
    if journal != hostinfo.NO_JOURNAL:
        return passed("work-root-journal", f"{journal} on {mount} for {work_root}")
    detail = (f"{journal} on {mount} for {work_root}: it does not reuse an inode freed in the "
              "last 30 s (5 min 30 s while its inode table block is dirty) and every create "
              "walks past each one, so deletions (each environment's cleanup, a workload's own) "
              "slow the creates of the environments after them: metadata results drift with "
              "the run order (benchmarks/inode_reuse.py)")  # fmt: skip
    fix = ("give a work root on a file system with a journal: --work-root DIR (ext4 has one by "
           "default; add one to an unmounted ext4 with tune2fs -O has_journal DEVICE)")  # fmt: skip
    return failed("work-root-journal", detail, fix)


def key_check() -> Check:
    """This host's signing key exists, loads and is private to its owner."""
    path = default_key_path()
    if not path.exists():
        return failed("signing-key", f"no host key at {path}", "sandbench host init")
    try:
        key = HostKey.load(path)
    except HostKeyError as exc:
        return failed("signing-key", str(exc), f"mv {path} {path}.bad && sandbench host init")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        return failed("signing-key", f"{path} is mode {mode:o}: others can read it",
                      f"chmod 600 {path}")  # fmt: skip
    return passed("signing-key", f"host '{key.name}', key {key.key_id} ({path}, mode 600)")


def tool_checks(work_root: Path) -> list[Check]:
    """Every line beyond the quota's."""
    return [bubblewrap_check(), userns_check(), overlayfs_check(work_root), dockerd_check(),
            kvm_check(), disk_check(work_root), journal_check(work_root),
            key_check()]  # fmt: skip


def run_checks(quota: Quota | None = None, work_root: Path | None = None) -> list[Check]:
    """The whole host check: the quota's lines, then the tools', in the order to fix them."""
    return quota_checks(quota) + tool_checks(work_root or DEFAULT_WORK_ROOT)
