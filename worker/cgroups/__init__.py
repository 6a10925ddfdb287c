"""The environment's cgroup: its quota, its accounting and its kill, for cgroup v1 and v2.

``Cgroup`` is the one abstraction; ``worker.cgroups.v1.CgroupV1`` and
``worker.cgroups.v2.CgroupV2`` implement it. Every environment gets its own cgroup: on v1
``/sandbench/<key>`` (the same relative path in every hierarchy, so docker's
``--cgroup-parent`` can use ``Cgroup.path`` as is); on v2 ``/sandbench/<key>`` from a root
shell, or ``<service>/envs/<key>`` under a delegated systemd service, with the launcher in a
leaf below it (``worker.cgroups.v2``). The launcher joins between fork and exec (``preexec``),
so its whole process tree is limited, measured and killed together.
"""

from __future__ import annotations

from contract.errors import QuotaError
from contract.records import Quota
from worker.cgroups.base import (
    CFS_PERIOD_US,
    CGROUP_ROOT,
    KILL_WAIT_S,
    MAX_NAME,
    PARENT_NAME,
    POLL_S,
    Cgroup,
    cgroup_mounts,
    cgroup_name,
    cpu_list,
    detect,
    remove_dir,
    write_file,
)
from worker.cgroups.v1 import CgroupV1
from worker.cgroups.v2 import CgroupV2

__all__ = [
    "CFS_PERIOD_US", "CGROUP_ROOT", "KILL_WAIT_S", "MAX_NAME", "PARENT_NAME", "POLL_S", "Cgroup",
    "QuotaError", "cgroup_mounts", "cgroup_name", "cpu_list", "create", "detect", "new_cgroup",
    "remove_dir", "write_file",
]  # fmt: skip


def new_cgroup(name: str, version: int | None = None) -> Cgroup:
    """A (not yet created) cgroup of environment ``name`` for the detected or given version."""
    version = version or detect()
    if version == 1:
        return CgroupV1(f"/{PARENT_NAME}/{name}")
    return CgroupV2.for_environment(name)


def create(name: str, quota: Quota | None, version: int | None = None) -> Cgroup:
    """Create the cgroup of environment ``name`` with ``quota`` applied."""
    cgroup = new_cgroup(name, version)
    cgroup.create(quota)
    return cgroup
