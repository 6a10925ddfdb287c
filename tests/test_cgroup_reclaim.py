"""No dying memory cgroup piles up: each environment's cgroup is gone once it is removed.

A removed memory cgroup lingers ("dying") while any page charged to it is cached: on ext4 the
metadata blocks an environment's file operations brought in (inode tables, bitmaps, directory
blocks) outlive its deleted files. Without the runner's cleanup order (files removed, the
deletions written back with a syncfs, the cgroup's memory reclaimed, then rmdir) every
environment left one behind: 66 after two 176-environment campaigns here. This runs a real
embedded campaign of metadata-heavy environments and counts the kernel's memory cgroups.
"""

from __future__ import annotations

from pathlib import Path

from test_campaign_local import Lab

ENVIRONMENTS = 15  # per cell; two cells: 30 environments
SLACK = 3  # other processes of the machine may hold a cgroup or two meanwhile
PLAN = f"""
name = "reclaim"
seed = 3
scale = 0.05
environments = {ENVIRONMENTS}
rounds = 1
workloads = ["create-small", "copy-tree"]
modes = ["native"]
sentinel = false
"""


def memory_cgroups() -> int:
    """The kernel's count of memory cgroups, dying ones included (/proc/cgroups; v1 or v2)."""
    for line in Path("/proc/cgroups").read_text().splitlines():
        fields = line.split()
        if fields and fields[0] == "memory":
            return int(fields[2])
    raise AssertionError("no memory controller in /proc/cgroups")


def test_environments_leave_no_dying_memory_cgroup(tmp_path: Path) -> None:
    """30 environments that create and copy small trees leave the count where it was."""
    lab = Lab(tmp_path)
    before = memory_cgroups()
    out = lab.sandbench("run", lab.plan(PLAN), *lab.run_args())
    assert "records: verified" in out.stdout, out.stdout[-2000:]
    after = memory_cgroups()
    assert after - before <= SLACK, f"{after - before} memory cgroups more after the campaign"
