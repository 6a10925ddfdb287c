"""The 19 workloads by name, in the design's table order, and their groups."""

from __future__ import annotations

import difflib

from tasks.errors import WorkloadError
from workloads import mechanism as m
from workloads import payload
from workloads import resource as r
from workloads import workflow as w
from workloads.base import Builder, Evolver, Group, Workload

GROUP_NAMES: tuple[Group, ...] = ("mechanism", "resource", "workflow")

# name -> (builder, evolver, ignore globs, whether the fixture holds seeded content)
_PARTS: dict[str, tuple[Builder, Evolver, tuple[str, ...], bool]] = {
    "seq-write": (m.build_empty("seq"), m.evolve_seq_write, (), False),
    "sync-write": (m.build_empty("sync"), m.evolve_sync_write, (), False),
    "create-small": (m.build_empty("create"), m.evolve_create_small, (), False),
    "read-small": (m.build_tree("read-small"), m.evolve_nothing, (), True),
    "stat-tree": (m.build_tree("stat-tree"), m.evolve_nothing, (), True),
    "readdir-wide": (m.build_readdir_wide, m.evolve_nothing, (), False),
    "read-large": (m.build_read_large, m.evolve_nothing, (), True),
    "rename-atomic": (m.build_rename_atomic, m.evolve_rename_atomic, (), True),
    "append-fsync": (m.build_append_fsync, m.evolve_append_fsync, (), False),
    "delete-tree": (m.build_delete_tree, m.evolve_delete_tree, (), True),
    "mmap-write": (m.build_mmap_write, m.evolve_mmap_write, (), True),
    "copy-tree": (m.build_tree("copy-tree", "copies"), m.evolve_copy_tree, (), True),
    "ws64-w1": (r.build_working_set, r.evolve_working_set, (), False),
    "ws256-w1": (r.build_working_set, r.evolve_working_set, (), False),
    "ws1024-w1": (r.build_working_set, r.evolve_working_set, (), False),
    "ws256-w4": (r.build_working_set, r.evolve_working_set, (), False),
    "repo-inspect": (w.build_repo, w.evolve_repo, w.REPO_IGNORE, True),
    "incremental-build": (w.build_project, w.evolve_project, w.BUILD_IGNORE, True),
    "publish": (m.build_empty("pub"), w.evolve_publish, (), False),
}


def _workload(number: int, name: str, group: str, summary: str) -> Workload:
    """Assemble workload ``name`` from the payload's table and its host-side parts."""
    builder, evolver, ignore, seeded = _PARTS[name]
    assert group in GROUP_NAMES
    return Workload(name, number, group, summary, builder, evolver, ignore, seeded)


WORKLOADS: dict[str, Workload] = {
    name: _workload(i, name, group, summary)
    for i, (name, group, summary, _) in enumerate(payload.TABLE, start=1)
}
GROUPS: dict[str, list[str]] = {
    g: [n for n, wl in WORKLOADS.items() if wl.group == g] for g in GROUP_NAMES
}
MAX_ROUNDS = payload.MAX_ROUNDS


def get_workload(name: str) -> Workload:
    """The workload called ``name``; WorkloadError with a suggestion otherwise."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise WorkloadError(_unknown(name)) from None


def _unknown(name: str) -> str:
    """An 'is not a workload' message with a did-you-mean suggestion when one is close."""
    choices = [*WORKLOADS, *GROUPS, "all"]
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; choose from {', '.join(WORKLOADS)}"
    return f"'{name}' is not a workload{hint}"


def resolve(names: list[str]) -> list[str]:
    """Expand workload names, group names and 'all' into workload names (first seen, no repeats)."""
    out: list[str] = []
    for name in names:
        if name == "all":
            expanded = list(WORKLOADS)
        elif name in GROUPS:
            expanded = GROUPS[name]
        else:
            expanded = [get_workload(name).name]
        out += [n for n in expanded if n not in out]
    return out
