"""Twelve injected faults: each gets its expected class and reason, and nothing survives it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from contract.records import REASONS, EnvironmentRecord, EnvironmentSpec, Quota
from worker.cgroups import PARENT_NAME, cgroup_mounts
from worker.modes.base import EnvContext
from worker.modes.vm import guest_sync
from worker.runner import run_environment
from worker.vm.qemu import GuestConfig

CAMPAIGN = "c-faults"
READY = '{"op": "ready"}'
CHECKED_0 = '{"op": "checked", "k": 0, "digest": null, "validated": true}'
MARK = "61.6"  # every sleep a fault starts carries this prefix, so a survivor is easy to spot
STAGED_COPY = {
    "staged": True, "prepare": ["cp", "-a", "{workspace}/.", "{env_dir}/copy"],
    "root": "{env_dir}/copy",
}  # fmt: skip
# A git first on PATH that SIGKILLs its caller: the payload dies inside round 1 of repo-inspect.
KILLING_GIT = (
    "mkdir {env_dir}/bin && printf '#!/bin/sh\\nkill -9 $PPID\\n' > {env_dir}/bin/git && "
    "chmod +x {env_dir}/bin/git && PATH={env_dir}/bin:$PATH exec {payload_argv}"
)


@dataclass(frozen=True)
class Fault:
    """One injected fault: how to launch it and what the record must say."""

    template: str | list[str]
    reason: str | None  # None: the environment passes
    detail: str = ""  # a phrase the record's detail must contain
    workload: str = "seq-write"
    limit_s: float = 30.0
    options: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)


FAULTS = {
    "stray-file-after-exit": Fault(
        "{payload_argv} && echo stray > {workspace}/stray.txt", "oracle-mismatch", "stray.txt"
    ),
    "corrupted-fixture-file": Fault(
        "printf X | dd of={workspace}/large.bin conv=notrunc status=none && exec {payload_argv}",
        "validation-failed",
        "round 1",
        workload="read-large",
    ),
    "nonzero-exit-after-the-rounds": Fault("{payload_argv}; exit 3", "nonzero-exit", "status 3"),
    "exit-before-ready": Fault(["/bin/true"], "no-ready", "ended"),
    "banner-before-ready": Fault(
        "echo 'Welcome to the runtime'; exec {payload_argv}", "no-ready", "not JSON"
    ),
    "limit-before-ready": Fault(
        f"exec sleep {MARK}1", "timeout", "limit of 3 s reached before Ready", limit_s=3.0
    ),
    "limit-after-ready": Fault(
        f"echo '{READY}'; read line; echo '{CHECKED_0}'; exec sleep {MARK}2",
        "timeout",
        "limit of 2 s reached in round 1",
        limit_s=2.0,
    ),
    "oom": Fault(
        "exec {payload_argv}",
        "oom",
        "OOM",
        workload="incremental-build",
        fields={"scale": 0.1, "quota": Quota(memory_bytes=12 << 20)},
    ),
    "leftover-child": Fault(f"(sleep {MARK}3 &); exec {{payload_argv}}", None, limit_s=60.0),
    "launcher-not-found": Fault(
        ["/nonexistent/sandbench-runtime", "{payload_argv}"], "launcher-error", "/nonexistent"
    ),
    "staged-runtime-writes-the-original": Fault(
        "touch {workspace}/oops && exec {payload_argv}",
        "workspace-modified",
        "oops",
        options=STAGED_COPY,
    ),
    # a tree of more than APART_ENTRIES entries: the check runs in a process of its own
    "staged-runtime-writes-a-large-original": Fault(
        "touch {workspace}/oops && exec {payload_argv}",
        "workspace-modified",
        "oops",
        workload="delete-tree",
        fields={"scale": 0.2},
        options=STAGED_COPY,
    ),
    # no preparation: the original's state before is its fixture's (``fixture_snapshot``)
    "staged-runtime-works-on-the-original": Fault(
        "exec {payload_argv}",
        "workspace-modified",
        "original workspace changed",
        options={"staged": True},
    ),
    # a preparation may change the original (here: adds a file): the state before is after it
    "staged-preparation-changes-the-original": Fault(
        "exec {payload_argv}",
        None,
        options={
            **STAGED_COPY,
            "prepare": "cp -a {workspace}/. {env_dir}/copy && touch {workspace}/prepared",
        },
    ),
    "killed-by-a-signal-mid-round": Fault(
        KILLING_GIT, "round-error", "round 1", workload="repo-inspect"
    ),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work root shared by the faults (fixtures are built once)."""
    return tmp_path_factory.mktemp("faults-work")


def inject(root: Path, fault: Fault) -> tuple[EnvironmentRecord, float]:
    """Run one command-mode environment carrying ``fault``; its record and wall time."""
    fields = {"scale": 0.02, **fault.fields}
    spec = EnvironmentSpec(
        campaign=CAMPAIGN, host="local", mode="command", workload=fault.workload, env_index=0,
        limit_s=fault.limit_s, work_root=str(root),
        mode_options={"template": fault.template, **fault.options}, **fields,
    )  # fmt: skip
    start = time.monotonic()
    record = run_environment(spec)
    assert record is not None
    return record, time.monotonic() - start


def survivors(root: Path) -> list[str]:
    """Everything an environment could leave: processes, cgroups, mounts, files."""
    left = [
        f"process {p.pid}: {' '.join(p.info['cmdline'])}"
        for p in psutil.process_iter(["cmdline"])
        if any(MARK in arg or str(root) in arg for arg in p.info["cmdline"] or [])
    ]
    for point in set(cgroup_mounts().values()):
        parent = point / PARENT_NAME
        if parent.is_dir():
            left += [f"cgroup {d}" for d in parent.iterdir() if d.name.startswith(CAMPAIGN)]
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    left += [f"mount {line.split()[4]}" for line in mounts if str(root) in line.split()[4]]
    left += [f"file {p}" for p in (root / "envs").iterdir()] if (root / "envs").exists() else []
    return left


@pytest.mark.parametrize("name", list(FAULTS))
def test_fault(root: Path, name: str) -> None:
    """The injected fault gets its expected class, reason and detail; nothing survives it."""
    fault = FAULTS[name]
    record, _ = inject(root, fault)
    if fault.reason is None:
        assert record.outcome == "passed", (record.reason, record.detail)
    else:
        assert (record.outcome, record.reason) == ("failed", fault.reason), record.detail
        assert record.failure_class == REASONS[fault.reason]
        assert fault.detail in (record.detail or ""), record.detail
    assert all(r.task_s > 0 for r in record.rounds), "a round time of zero"
    assert survivors(root) == []


def test_leftover_child_is_killed_at_once_and_noted(root: Path) -> None:
    """A runtime leaving a child behind passes within seconds, the child counted and killed."""
    record, took = inject(root, FAULTS["leftover-child"])
    assert record.outcome == "passed", record.detail
    assert record.leftover_processes == 1 and took < 10
    assert survivors(root) == []


def test_a_clean_exit_leaves_nothing_to_count(root: Path) -> None:
    """A payload that exits on its own leaves zero processes behind, recorded as 0."""
    record, _ = inject(root, Fault("exec {payload_argv}", None))
    assert record.outcome == "passed" and record.leftover_processes == 0


@pytest.mark.parametrize("name", ["limit-before-ready", "limit-after-ready"])
def test_the_limit_ends_the_environment_on_time(root: Path, name: str) -> None:
    """A limit is enforced at the limit, not later: the environment ends within 3 s of it."""
    fault = FAULTS[name]
    _, took = inject(root, fault)
    assert fault.limit_s <= took < fault.limit_s + 3


def test_a_sync_past_the_limit_is_a_timeout(root: Path) -> None:
    """A mode's round sync that runs past the limit is a timeout naming the sync, at the limit."""
    fault = Fault("exec {payload_argv}", "timeout", options={"sync": ["sleep", f"{MARK}4"]})
    record, took = inject(root, replace(fault, limit_s=3.0))
    assert (record.outcome, record.reason) == ("failed", "timeout"), record.detail
    assert record.detail == "limit of 3 s reached in round 1's sync" and took < 3 + 3
    assert survivors(root) == []


def test_guest_sync_is_bounded_by_the_remaining_time(tmp_path: Path) -> None:
    """A guest that never answers its sync gives up at the environment's deadline, not later."""
    base = tmp_path / "ctl"
    fds = []
    for suffix in (".in", ".out"):  # held open read-write, as QEMU holds them
        os.mkfifo(f"{base}{suffix}")
        fds.append(os.open(f"{base}{suffix}", os.O_RDWR))
    spec = EnvironmentSpec(
        campaign=CAMPAIGN, host="local", mode="vm-writeback", workload="publish", env_index=0,
        limit_s=90.0, work_root=str(tmp_path),
    )  # fmt: skip
    env = EnvContext(
        spec, tmp_path / "ws", tmp_path, "/", deadline_ns=time.monotonic_ns() + 500_000_000
    )
    env.state["vm_config"] = GuestConfig(
        tmp_path / "k", tmp_path / "i", tmp_path / "j", tmp_path / "c", ctl_pipe=base
    )
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="within the limit"):
            guest_sync(env, 1)
    finally:
        for fd in [*fds, env.state.get("ctl_in"), env.state.get("ctl_out")]:
            if fd is not None:
                os.close(fd)
    assert 0.4 < time.monotonic() - start < 3
