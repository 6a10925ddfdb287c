"""The lab host check: what sandbench needs on this host, each line ok or failed with its fix.

``sandbench host check`` prints every line (``run_checks``); ``sandbench worker`` refuses to
start when a line of the quota (``quota_checks``: the cgroup hierarchy, its controllers,
delegation, swap accounting, the quota's CPUs and memory, and a trial cgroup that takes the
quota) fails, instead of failing every environment it is sent. The other lines (sandboxes,
overlayfs, dockerd, KVM, disk space, the signing key) live in ``worker.hostcheck_tools``.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from contract.errors import HostCheckFailed
from contract.records import Quota
from worker import cgroups, hostinfo
from worker.cgroups import v1 as cgroupsv1
from worker.cgroups import v2 as cgroupsv2

CPU_SYSFS = Path("/sys/devices/system/cpu")
SWAPS = Path("/proc/swaps")
TRIAL_NAME = "host-check"
SWAP_LIMITS = ("memory.swap.max", "memory.memsw.limit_in_bytes")  # absent without swap accounting
FIX_MOUNT = (
    "mount -t cgroup2 none /sys/fs/cgroup (systemd hosts: boot with "
    "systemd.unified_cgroup_hierarchy=1), as root"
)
FIX_DELEGATE = (
    "Delegate=yes in the [Service] section of the worker's unit "
    "(ops/systemd/sandbench-worker@.service has it), then systemctl daemon-reload and restart"
)
FIX_SWAP = (
    "boot with swapaccount=1 (add it to GRUB_CMDLINE_LINUX in /etc/default/grub, update-grub, "
    "reboot), or turn swap off: swapoff -a"
)
FIX_ROOT = "run as root (the systemd unit sandbench-worker@.service does)"


@dataclass(frozen=True)
class Check:
    """One line of the host check: its name, the verdict, what was found, how to fix it."""

    name: str
    ok: bool
    detail: str
    fix: str = ""  # for a failed line: the exact command or unit setting that fixes it

    def as_dict(self) -> dict[str, object]:
        """The line as JSON-friendly data."""
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "fix": self.fix or None}


def passed(name: str, detail: str) -> Check:
    """An ok line."""
    return Check(name, True, detail)


def failed(name: str, detail: str, fix: str) -> Check:
    """A failed line with its fix."""
    return Check(name, False, detail, fix)


def cgroup_version_check() -> tuple[Check, int | None]:
    """Which cgroup version carries the controllers here, and where it is mounted."""
    try:
        version = cgroups.detect()
    except cgroups.QuotaError as exc:
        return failed("cgroup-version", str(exc), FIX_MOUNT), None
    mounts = cgroups.cgroup_mounts()
    if version == 2:
        return passed("cgroup-version", f"cgroup v2 (unified) at {mounts['cgroup2']}"), 2
    where = sorted({str(mounts[c].parent) for c in cgroupsv1.REQUIRED})
    layout = hostinfo.cgroup_version()
    return passed("cgroup-version", f"cgroup v1 (under {', '.join(where)}); layout: {layout}"), 1


def controllers_check(version: int) -> Check:
    """The controllers the quota needs: mounted (v1), or available and enabled down to us (v2)."""
    mounts = cgroups.cgroup_mounts()
    if version == 1:
        missing = [c for c in cgroupsv1.REQUIRED if c not in mounts]
        if missing:
            fix = "; ".join(f"mount -t cgroup -o {c} cgroup /sys/fs/cgroup/{c}" for c in missing)
            return failed("controllers", f"v1 controllers not mounted: {missing}", fix)
        return passed("controllers", f"v1: {' '.join(cgroupsv1.REQUIRED)} mounted")
    root = mounts["cgroup2"]
    where = cgroupsv2.placement(root)
    levels = _levels(where.anchor)
    for parent, child in itertools.pairwise(levels):
        enabled = (_dir(root, parent) / "cgroup.subtree_control").read_text().split()
        missing = [c for c in cgroupsv2.NEEDED_CONTROLLERS if c not in enabled]
        if missing:
            detail = f"{' '.join(missing)} not enabled in {parent}'s cgroup.subtree_control"
            fix = FIX_DELEGATE if where.kind == "delegated" else _enable_fix(root, parent, missing)
            return failed("controllers", f"{detail}, so {child} cannot use them", fix)
    available = (_dir(root, where.anchor) / "cgroup.controllers").read_text().split()
    missing = [c for c in cgroupsv2.NEEDED_CONTROLLERS if c not in available]
    if missing:
        fix = "boot with cgroup_no_v1=all (the controllers are bound to cgroup v1)"
        return failed("controllers", f"{' '.join(missing)} unavailable at {where.anchor}", fix)
    path = " -> ".join(levels)
    return passed("controllers", f"v2: {' '.join(available)} available at {where.anchor} ({path})")


def _levels(anchor: str) -> list[str]:
    """The cgroups from the root down to ``anchor``: ``["/", "/a", "/a/b"]``."""
    parts = PurePosixPath(anchor).parts[1:]
    return ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _dir(root: Path, cgroup: str) -> Path:
    """The directory of ``cgroup`` under the mount ``root``."""
    return root / cgroup.strip("/")


def _enable_fix(root: Path, cgroup: str, missing: list[str]) -> str:
    """The command that enables ``missing`` for the children of ``cgroup``."""
    plus = " ".join(f"+{c}" for c in missing)
    return f"echo '{plus}' > {_dir(root, cgroup) / 'cgroup.subtree_control'}"


def delegation_check(version: int) -> Check:
    """Where environment cgroups go: a delegated subtree, or /sandbench (never behind systemd)."""
    if version == 1:
        return passed("delegation", "not needed on cgroup v1: environments in /sandbench/<key>")
    where = cgroupsv2.placement()
    if where.kind == "delegated":
        return passed(
            "delegation",
            f"delegated service {where.anchor}: environments in {where.parent}/<key>, "
            f"this process's own in {where.anchor}/{cgroupsv2.SUPERVISOR_LEAF}",
        )
    service = _service_of(where.own)
    if service is not None:
        return failed(
            "delegation",
            f"running in {service} without delegation: environment cgroups would go to "
            f"/{cgroups.PARENT_NAME}, outside the unit's subtree and behind systemd's back",
            f"{FIX_DELEGATE} (systemd < 251: also Environment={cgroupsv2.DELEGATED_ENV}=1)",
        )
    return passed(
        "delegation",
        f"outside any service ({where.own}): environments in /{cgroups.PARENT_NAME}/<key>",
    )


def _service_of(cgroup: str) -> str | None:
    """The systemd service ``cgroup`` belongs to (``x.service`` or its leaf), else None."""
    path = PurePosixPath(cgroup)
    for candidate in (path, path.parent):
        if candidate.name.endswith(".service"):
            return str(candidate)
    return None


def quota_cpus_check(quota: Quota, version: int | None) -> Check:
    """The quota's CPUs exist, are online and (delegated v2) are allowed to our subtree."""
    wanted = cgroups.cpu_list(quota.cpus)
    online_text = (CPU_SYSFS / "online").read_text().strip()
    online = set(cgroups.cpu_list(online_text))
    absent = [n for n in wanted if not (CPU_SYSFS / f"cpu{n}").is_dir()]
    if absent:
        fix = f"give the plan a quota.cpus of CPUs this host has (online here: {online_text})"
        return failed("quota-cpus", f"CPUs {absent} of the quota {quota.cpus} do not exist", fix)
    offline = [n for n in wanted if n not in online]
    if offline:
        fix = "; ".join(f"echo 1 > {CPU_SYSFS}/cpu{n}/online" for n in offline)
        return failed("quota-cpus", f"CPUs {offline} of the quota {quota.cpus} are offline", fix)
    allowed = _allowed_cpus(version)
    if allowed is not None and not set(wanted) <= set(cgroups.cpu_list(allowed)):
        fix = f"AllowedCPUs= of the worker's unit (or its slice) must include {quota.cpus}"
        return failed("quota-cpus", f"this subtree may use CPUs {allowed} only", fix)
    return passed("quota-cpus", f"CPUs {quota.cpus} exist and are online (online: {online_text})")


def _allowed_cpus(version: int | None) -> str | None:
    """The CPUs a delegated v2 subtree may use (``cpuset.cpus.effective``), else None."""
    if version != 2:
        return None
    where = cgroupsv2.placement()
    path = _dir(cgroupsv2.unified_root(), where.anchor) / "cpuset.cpus.effective"
    if where.kind != "delegated" or not path.exists():
        return None
    return path.read_text().strip() or None


def quota_memory_check(quota: Quota) -> Check:
    """The memory quota fits in this host's memory."""
    total = hostinfo.memory_bytes()
    detail = f"{_gib(quota.memory_bytes)} quota of {_gib(total)} installed"
    if quota.memory_bytes >= total:
        return failed("quota-memory", detail, "a host with more memory, or a smaller quota.memory")
    return passed("quota-memory", detail)


def _gib(n: int) -> str:
    """Bytes as GiB with one decimal."""
    return f"{n / 2**30:.1f} GiB"


def quota_applies_check(quota: Quota, version: int | None) -> tuple[Check, dict[str, str]]:
    """A trial cgroup takes the quota and its files read it back; the limits read."""
    if version is None:
        return failed("quota-applies", "no usable cgroup hierarchy", FIX_MOUNT), {}
    try:
        group = cgroups.new_cgroup(cgroups.cgroup_name(TRIAL_NAME), version)
        try:
            group.create(quota)
            limits = group.limits()
        finally:
            with contextlib.suppress(cgroups.QuotaError):
                group.remove()
    except (cgroups.QuotaError, OSError) as exc:
        denied = "denied" in str(exc) or "not permitted" in str(exc)
        fix = FIX_ROOT if denied else "fix the failed lines above (controllers, quota-cpus)"
        return failed("quota-applies", f"a trial cgroup refused the quota: {exc}", fix), {}
    wanted = _wanted(quota, version, limits)
    wrong = [f"{k} {limits.get(k)!r} (wanted {v!r})" for k, v in wanted.items()
             if _normal(k, limits.get(k)) != _normal(k, v)]  # fmt: skip
    shown = ", ".join(f"{k} {v}" for k, v in limits.items())
    if wrong:
        return failed("quota-applies", f"limits read back wrong: {'; '.join(wrong)}", FIX_ROOT), {}
    return passed("quota-applies", f"a trial cgroup took the quota: {shown}"), limits


def _wanted(quota: Quota, version: int, limits: dict[str, str]) -> dict[str, str]:
    """The limit files the quota writes and what they must read back (swap where accounted)."""
    quota_us = str(max(1000, int(quota.cpu_quota * cgroups.CFS_PERIOD_US)))
    if version == 2:
        wanted = {
            "cpu.max": f"{quota_us} {cgroups.CFS_PERIOD_US}",
            "cpuset.cpus": quota.cpus,
            "cpuset.cpus.effective": quota.cpus,  # a parent's cpuset may narrow it silently
            "memory.max": str(quota.memory_bytes),
            "memory.swap.max": str(quota.swap_bytes),
        }
    else:
        wanted = {
            "cpu.cfs_quota_us": quota_us,
            "cpuset.cpus": quota.cpus,
            "memory.limit_in_bytes": str(quota.memory_bytes),
            "memory.memsw.limit_in_bytes": str(quota.memory_bytes + quota.swap_bytes),
        }
    return {k: v for k, v in wanted.items() if k in limits or k not in SWAP_LIMITS}


def _normal(name: str, value: str | None) -> object:
    """A limit in comparable form (a cpuset list as its CPU numbers)."""
    if value is not None and name.startswith("cpuset.cpus"):
        return cgroups.cpu_list(value)
    return value


def swap_check(version: int | None, limits: dict[str, str]) -> Check:
    """Swap is accounted (v1 memsw, v2 memory.swap.max), or no swap device is active."""
    name = "memory.memsw.limit_in_bytes" if version == 1 else "memory.swap.max"
    if version == 1:
        memory = cgroups.cgroup_mounts().get("memory")
        present = memory is not None and (memory / name).exists()
    elif not limits:
        return failed("swap-accounting", "not checked: no trial cgroup", "fix quota-applies")
    else:
        present = name in limits
    if present:
        return passed("swap-accounting", f"{name} is there: the quota's swap limit binds")
    devices = SWAPS.read_text().splitlines()[1:] if SWAPS.exists() else []
    if not devices:
        return passed("swap-accounting", f"no {name}, but no swap is active: nothing can swap")
    return failed("swap-accounting", f"no {name} while {len(devices)} swap device(s) are on",
                  FIX_SWAP)  # fmt: skip


def quota_checks(quota: Quota | None = None) -> list[Check]:
    """Every line the quota depends on, in the order a user fixes them."""
    quota = quota or Quota()
    version_line, version = cgroup_version_check()
    lines = [version_line]
    if version is not None:
        lines += [controllers_check(version), delegation_check(version)]
    applies, limits = quota_applies_check(quota, version)
    lines += [swap_check(version, limits), quota_cpus_check(quota, version),
              quota_memory_check(quota), applies]  # fmt: skip
    return lines


def require_quota(quota: Quota | None = None) -> list[Check]:
    """The quota's lines; ``HostCheckFailed`` naming each failed one and its fix."""
    lines = quota_checks(quota)
    bad = [c for c in lines if not c.ok]
    if bad:
        why = " | ".join(f"{c.name}: {c.detail}; fix: {c.fix}" for c in bad)
        raise HostCheckFailed(f"the quota cannot be applied on this host: {why}")
    return lines
