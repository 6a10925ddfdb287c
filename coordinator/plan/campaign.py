"""Campaigns: a plan expanded per host into environments in a seeded run order."""

from __future__ import annotations

import hashlib
import random
import secrets
import uuid
from collections import Counter
from datetime import UTC, datetime

from contract.records import EnvironmentSpec
from coordinator.plan import sentinel
from coordinator.plan.file import BLOCKED, Plan
from coordinator.plan.modes import ModeEntry

CAMPAIGN_ID_FORMAT = "c-{date}-{suffix}"
SUFFIX_BYTES = 2  # four hex digits


def new_campaign_id(now: datetime | None = None) -> str:
    """A fresh campaign id, ``c-YYYYMMDD-xxxx``."""
    date = (now or datetime.now(UTC)).strftime("%Y%m%d")
    return CAMPAIGN_ID_FORMAT.format(date=date, suffix=secrets.token_hex(SUFFIX_BYTES))


def host_rng(seed: int, host: str) -> random.Random:
    """The seeded generator of one host's run order (stable across Python versions)."""
    digest = hashlib.sha256(f"sandbench-order/{seed}/{host}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def expand(
    plan: Plan,
    hosts: list[str],
    campaign_id: str,
    work_root: str,
    *,
    attempt: int = 1,
) -> list[EnvironmentSpec]:
    """Every planned environment of every host, each host's list in its seeded run order.

    A blocked order (the default) runs environment i of every cell in block i, blocks in that
    order, each shuffled by the seed: every cell's environments are spread evenly over the
    campaign, so a slow spell of the machine slows one environment of each cell rather than,
    by chance, several of one mode. A shuffled plan (``order = "shuffled"``) runs one shuffle
    of all, as every campaign did before 2026-12-07.
    The sentinel's calibration points (``coordinator.plan.sentinel``) are placed in that order at
    the start, after every K environments and at the end, unless the plan turns them off.
    """
    specs: list[EnvironmentSpec] = []
    cells = plan.cells()
    quota = plan.quota.quota()
    for host in hosts:
        slots = run_order(plan, cells, host_rng(plan.seed, host))
        shared = {"campaign": campaign_id, "cohort": plan.cohort, "host": host, "quota": quota,
                  "vm": plan.vm.size(), "work_root": work_root}  # fmt: skip
        for order, slot in enumerate(sentinel.layout(len(slots), plan.sentinel.every)):
            if isinstance(slot, tuple):
                specs.append(sentinel.spec(shared, *slot, order, plan.limit_s))
                continue
            entry, workload, env_index = slots[slot]
            cell_spec = EnvironmentSpec(
                **shared, mode=entry.name, workload=workload, env_index=env_index,
                attempt=attempt, order_index=order, task_id=uuid.uuid4().hex, seed=plan.seed,
                scale=plan.scale, rounds=plan.rounds, limit_s=plan.limit_s,
                mode_options=entry.mode_options(),
            )  # fmt: skip
            specs.append(cell_spec)
    return specs


def run_order(plan: Plan, cells: list[tuple[ModeEntry, str]],
              rng: random.Random) -> list[tuple[ModeEntry, str, int]]:  # fmt: skip
    """One host's (mode, workload, environment index) slots in the plan's order."""
    if plan.order != BLOCKED:
        slots = [(entry, w, i) for entry, w in cells for i in range(plan.environments)]
        rng.shuffle(slots)
        return slots
    blocks = [[(entry, w, i) for entry, w in cells] for i in range(plan.environments)]
    for block in blocks:
        rng.shuffle(block)
    return [slot for block in blocks for slot in block]


def describe(plan: Plan) -> list[str]:
    """Human lines saying what the plan expands to on one host (``sandbench plan show``)."""
    q = plan.quota
    lines = [
        (
            f"plan '{plan.name}': cohort {plan.cohort}, seed {plan.seed} ({plan.order} order), "
            f"{plan.environments} environments x {plan.rounds} rounds per cell, "
            f"scale {plan.scale:g}, limit {plan.limit_s:g} s"
        ),
        (
            f"quota: cpus {q.cpus}, {q.cpu_quota:g} cores, memory {format_size(q.memory)}, "
            f"swap {format_size(q.swap)}; VM guest {plan.vm.vcpus} vCPU / {plan.vm.memory_mib} MiB"
        ),
    ]
    per_mode = Counter(entry.name for entry, _ in plan.cells())
    by_count: dict[int, list[str]] = {}
    for entry in plan.mode_entries():
        by_count.setdefault(per_mode[entry.name], []).append(entry.name)
    terms = []
    for count, modes in by_count.items():
        terms.append(
            f"{_n(count, 'workload')} x {_n(len(modes), 'mode')} x "
            f"{_n(plan.environments, 'environment')}"
        )
        kind = ", ".join(_mode_label(plan, m) for m in modes)
        lines.append(f"  {_n(count, 'workload'):>12} each: {kind}")
    total = sum(per_mode.values()) * plan.environments
    lines.append(f"expansion per host: {' + '.join(terms)} = {total} environments")
    if len(by_count) > 1:
        lines.append("  (some modes run a subset of the workloads: see the notes)")
    lines.insert(2, _sentinel_line(plan, total))
    lines += [f"note: {n}" for n in plan.notes]
    return lines


def _sentinel_line(plan: Plan, total: int) -> str:
    """What the machine-state sentinel adds per host (or that the plan turned it off)."""
    every = plan.sentinel.every
    if not every:
        return "sentinel: off (sentinel = false): compare cannot tell the machine's own drift"
    n = sentinel.points(total, every)
    return (
        f"sentinel: {_n(n, 'point')} (start, every {every} environments, end) x "
        f"{', '.join(sentinel.WORKLOADS)} = {n * len(sentinel.WORKLOADS)} calibration "
        "environments, native, in no cell"
    )


def _mode_label(plan: Plan, name: str) -> str:
    entry = next(e for e in plan.mode_entries() if e.name == name)
    if entry.template is not None:
        template = entry.template if isinstance(entry.template, str) else " ".join(entry.template)
        return f"{name} (command: {template})"
    if entry.workloads is not None:
        return f"{name} ({', '.join(entry.workloads)})"
    return name


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def format_size(n: int) -> str:
    """Bytes as a short human size (``2 GiB``)."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor:
            return f"{n / factor:g} {unit}"
    return f"{n} B"


def planned_total(plan: Plan) -> int:
    """Environments per host."""
    return len(plan.cells()) * plan.environments
