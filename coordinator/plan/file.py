"""The plan: a validated TOML file (workloads x modes x environments x rounds, quota, limits).

Example::

    name = "mine"
    cohort = "default"          # results of two cohorts are never pooled
    seed = 1                    # same seed, same run order
    order = "blocked"           # environment i of every cell in block i, shuffled within it
    environments = 3            # N fresh environments per cell
    rounds = 3                  # R dependent rounds per environment
    limit_s = 90
    scale = 1.0
    workloads = ["all"]         # names, groups (mechanism, resource, workflow) or "all"
    modes = ["native", "staged", { name = "vm", workloads = ["workflow"] },
             { name = "runsc-do", template = ["runsc", "do", "{payload_argv}"] }]
    notes = ["why this plan looks the way it does"]
    sentinel = true             # calibration points every 80 environments; false: none
    [quota]
    cpus = "0,1"
    cpu_quota = 2.0
    memory = "2GiB"
    swap = "0"
    [vm]
    vcpus = 2
    memory_mib = 512

Values have their exact TOML type (``environments = true`` or ``scale = "0.02"`` is refused)
and bounds; a command mode (a mode table with ``template``) has a name of its own, neither a
built-in mode's nor another mode's of the plan; a built-in mode takes only the ``options`` it
declares (``Mode.option_names``) and no command-mode key.

The run order (``coordinator.plan.campaign.run_order``) is ``blocked`` unless ``order =
"shuffled"``: blocks of one environment of every cell, each block shuffled by the seed, so
that every cell's environments are spread evenly over the campaign; a shuffled order is one
shuffle of every environment, the order of campaigns planned before 2026-12-07.

The machine-state sentinel (``coordinator.plan.sentinel``) is on unless ``sentinel = false``; a
``[sentinel]`` table with ``every = K`` sets how many environments run between its points.
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from contract.errors import PlanError
from contract.names import Name
from contract.records import Quota, VmSize
from coordinator.plan.modes import ModeEntry, check_modes, near
from coordinator.plan.sentinel import SentinelPlan
from worker.cgroups import CFS_PERIOD_US
from workloads.kit import MAX_ROUNDS

ALL = "all"
PRESETS = ("smoke", "reference", "full")
SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2,
              "MIB": 1024**2, "G": 1024**3, "GB": 1024**3, "GIB": 1024**3}  # fmt: skip
SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
CPU_LIST_RE = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*\Z")
MAX_CPU = 8191  # the kernel's largest CPU number (NR_CPUS is at most 8192)
MAX_BYTES = 1 << 50  # 1 PiB: a memory or swap size beyond any lab host, surely a typo
MIN_MEMORY = 64 * 1024**2  # an environment's least memory: the payload's interpreter and tools
# The least CFS quota per period the kernel takes (cgroup v1 and v2 alike; worker.cgroups.v1 and
# worker.cgroups.v2 raise a smaller one to it): a smaller cpu_quota would not be what runs.
MIN_QUOTA_US = 1000
MIN_CPU_QUOTA = MIN_QUOTA_US / CFS_PERIOD_US  # 0.01 core
MAX_SEED = 2**63 - 1  # TOML's largest integer
RunOrder = Literal["blocked", "shuffled"]  # a block per environment index; one shuffle of all
BLOCKED: RunOrder = "blocked"
MAX_VCPUS = 255  # QEMU's x86 limit without interrupt remapping
MIN_VM_MEMORY_MIB = 128  # the guest's kernel, initramfs and the payload's interpreter
MAX_VM_MEMORY_MIB = 1 << 20  # 1 TiB: beyond any lab host, surely a typo
MAX_LIMIT_S = 24 * 3600  # an environment's limit; a day is surely a typo
MAX_ENVIRONMENTS = 1000  # per cell: N >= 30 already gives P95
# Environments per host: campaign.json, the queue and the store stay in the tens of megabytes.
MAX_PLANNED = 50_000
# Smoke preset: modes that boot a guest per environment (registry attribute ``boots_guest``: the
# VM modes, tens of seconds under TCG) get only these workloads; the full preset keeps them all.
SMOKE_VM_WORKLOADS = ("publish",)
SMOKE_SCALE = 0.02
SIZE_FIX = 'write a whole number of bytes or a string such as "2GiB", "512MiB" or "0"'
TOML_KINDS: dict[type, str] = {dict: "a table", list: "a list"}


def parse_size(value: object) -> int:
    """Bytes from an int or a string like ``"2GiB"``, ``"512M"``, ``"0"``; ValueError otherwise."""
    if isinstance(value, bool | float):
        raise ValueError(f"not a size; {SIZE_FIX}")  # the message shows the value itself
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        kind = TOML_KINDS.get(type(value), f"a {type(value).__name__}")  # or a date, a time
        raise ValueError(f"{kind} is not a size; {SIZE_FIX}")
    m = SIZE_RE.match(value)
    if not m or m.group(2).upper() not in SIZE_UNITS:
        raise ValueError(f'\'{value}\' is not a size; write e.g. "2GiB", "512MiB" or "0"')
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2).upper()])


def parse_cpus(text: str) -> list[int]:
    """CPU numbers of a well-formed cpuset list (``"0,1"``, ``"0-3,6"``); ValueError otherwise."""
    if not CPU_LIST_RE.match(text):
        raise ValueError(f'{text!r} is not a CPU list; write e.g. "0,1" or "0-3"')
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if first > last or last > MAX_CPU:
            raise ValueError(f"'{part}' is not a CPU range; write low-high with high <= {MAX_CPU}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


class QuotaPlan(BaseModel):
    """The ``[quota]`` table: applied to every environment's whole process tree."""

    model_config = ConfigDict(extra="forbid", strict=True)

    cpus: str = "0,1"
    cpu_quota: float = Field(2.0, gt=0, allow_inf_nan=False)  # cores; bounds: _quota_fits_cpus
    memory: int = Field(2 * 1024**3, gt=0)  # bytes; "2GiB" and the like are accepted
    swap: int = Field(0, ge=0)

    @field_validator("memory", "swap", mode="before")
    @classmethod
    def _size(cls, value: object, info: ValidationInfo) -> int:
        size = parse_size(value)
        if size > MAX_BYTES:
            raise ValueError(f'{value!r} is more than 1 PiB, surely a typo; write e.g. "2GiB"')
        if info.field_name == "memory" and size < MIN_MEMORY:
            raise ValueError(
                f"{size} B is below {MIN_MEMORY >> 20} MiB, the least memory an environment "
                'gets; write e.g. "2GiB"'
            )
        return size

    @field_validator("cpus")
    @classmethod
    def _cpus(cls, value: str) -> str:
        parse_cpus(value)
        return value

    @model_validator(mode="after")
    def _quota_fits_cpus(self) -> QuotaPlan:
        count = len(parse_cpus(self.cpus))
        if self.cpu_quota < MIN_CPU_QUOTA:
            raise ValueError(
                f"cpu_quota {self.cpu_quota:g} is below {MIN_CPU_QUOTA:g} core, the least the "
                f"cgroup enforces ({MIN_QUOTA_US} us per {CFS_PERIOD_US} us period: a smaller "
                f"quota is raised to it); give {MIN_CPU_QUOTA:g} to {count} for cpus "
                f"{json.dumps(self.cpus)}"
            )
        if self.cpu_quota > count:
            raise ValueError(
                f"cpu_quota {self.cpu_quota:g} exceeds the {count} CPU{'s' * (count != 1)} of cpus "
                f"{json.dumps(self.cpus)}; give at most {count} or list more CPUs"
            )
        return self

    def quota(self) -> Quota:
        """The quota as the runner takes it."""
        return Quota(
            cpus=self.cpus, cpu_quota=self.cpu_quota,
            memory_bytes=self.memory, swap_bytes=self.swap,
        )  # fmt: skip


class VmPlan(BaseModel):
    """The ``[vm]`` table: the guest of every VM mode."""

    model_config = ConfigDict(extra="forbid", strict=True)

    vcpus: int = Field(2, ge=1, le=MAX_VCPUS)
    memory_mib: int = Field(512, ge=MIN_VM_MEMORY_MIB, le=MAX_VM_MEMORY_MIB)

    def size(self) -> VmSize:
        """The guest's size as the VM modes take it."""
        return VmSize(vcpus=self.vcpus, memory_mib=self.memory_mib)


class Plan(BaseModel):
    """A validated plan."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = "campaign"
    cohort: Name = "default"  # becomes part of report file names
    seed: int = Field(0, ge=0, le=MAX_SEED)
    order: RunOrder = BLOCKED  # coordinator.plan.campaign.run_order
    environments: int = Field(3, ge=1, le=MAX_ENVIRONMENTS)
    rounds: int = Field(3, ge=1, le=MAX_ROUNDS)  # fixtures prepare state for MAX_ROUNDS
    limit_s: float = Field(90.0, gt=0, le=MAX_LIMIT_S, allow_inf_nan=False)
    scale: float = Field(1.0, gt=0, le=1.0, allow_inf_nan=False)
    workloads: list[str] = Field(default_factory=lambda: [ALL], min_length=1)
    modes: list[str | ModeEntry] = Field(min_length=1)
    quota: QuotaPlan = Field(default_factory=lambda: QuotaPlan.model_validate({}))
    vm: VmPlan = Field(default_factory=lambda: VmPlan.model_validate({}))
    notes: list[str] = Field(default_factory=list)
    sentinel: SentinelPlan = Field(default_factory=lambda: SentinelPlan.model_validate({}))

    @field_validator("sentinel", mode="before")
    @classmethod
    def _sentinel(cls, value: Any) -> Any:
        return SentinelPlan.of(value)

    def mode_entries(self) -> list[ModeEntry]:
        """Every mode as a ``ModeEntry``."""
        return [m if isinstance(m, ModeEntry) else ModeEntry(name=m) for m in self.modes]

    def cells(self) -> list[tuple[ModeEntry, str]]:
        """(mode, workload) pairs of one host, modes in plan order, workloads in registry order."""
        out = []
        for entry in self.mode_entries():
            names = entry.workloads if entry.workloads is not None else self.workloads
            out += [(entry, w) for w in resolve_workloads(names)]
        return out


def _workload_registry() -> tuple[dict[str, str], list[str]]:
    """Workload name -> group, and the group names, from ``workloads.registry``."""
    from workloads.registry import WORKLOADS

    groups = {name: str(w.group) for name, w in WORKLOADS.items()}
    return groups, sorted(set(groups.values()))


def resolve_workloads(names: list[str]) -> list[str]:
    """Workload names from names, groups or ``all``, in registry order, without duplicates."""
    groups, _ = _workload_registry()
    wanted = set()
    for n in names:
        wanted |= set(groups) if n == ALL else {w for w, g in groups.items() if n in (w, g)}
    return [w for w in groups if w in wanted]


def _check_names(plan: Plan, source: str) -> None:
    """Every workload and mode named by ``plan`` exists (or is a command mode)."""
    groups, group_names = _workload_registry()
    choices = [*groups, *group_names, ALL]

    def check_workloads(names: list[str], where: str) -> None:
        for i, n in enumerate(names):
            if n not in choices:
                raise PlanError(f"{source}: {where}[{i}] '{n}' is not a workload{near(n, choices)}")

    check_workloads(plan.workloads, "workloads")
    for i, mode in enumerate(plan.modes):  # a mode given by name: that name must be usable
        try:
            if isinstance(mode, str):
                ModeEntry(name=mode)
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise PlanError(f"{source}: modes[{i}]: {msg}") from exc
    entries = plan.mode_entries()
    check_modes(entries, source)
    for i, entry in enumerate(entries):
        if entry.workloads is not None:
            check_workloads(entry.workloads, f"modes[{i}].workloads")
            if not entry.workloads:
                raise PlanError(
                    f"{source}: modes[{i}].workloads is empty; name a workload or drop the key"
                )


def _check_size(plan: Plan, source: str) -> None:
    """The plan expands to at least one and at most ``MAX_PLANNED`` environments per host."""
    cells = len(plan.cells())
    total = cells * plan.environments
    if total > MAX_PLANNED:
        raise PlanError(
            f"{source}: the plan expands to {total:,} environments per host ({cells} cells x "
            f"{plan.environments} environments); at most {MAX_PLANNED:,}: lower environments "
            "or plan fewer workloads or modes"
        )


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in ("str", "ModeEntry", "int"):
            out += f".{part}" if out else str(part)
    return out


def _given(value: object, message: str) -> str:
    """`` = value`` as the plan wrote it, unless ``message`` already shows it or it is a table."""
    if isinstance(value, bool):
        shown = "true" if value else "false"
    elif isinstance(value, float) and not math.isfinite(value):
        shown = str(value)  # inf, -inf, nan: what TOML spells
    elif isinstance(value, int | float | str):
        shown = json.dumps(value)
    else:
        return ""
    if isinstance(value, str):
        said = repr(value) in message or f"'{value}'" in message
    else:
        said = message.startswith(f"{value} ")
    return "" if said else f" = {shown}"


def _type_fix(err: Any) -> str:
    """What to write instead of a value of the wrong TOML type (a quoted number, a boolean)."""
    value, kind = err.get("input"), err["type"]
    if kind not in ("int_type", "float_type"):
        return ""
    if isinstance(value, bool):
        return "; write a number, not true or false"
    if isinstance(value, str):
        try:
            number = int(value) if kind == "int_type" else float(value)
        except ValueError:
            return ""
        return f"; write it without quotes: {value.strip()}" if math.isfinite(number) else ""
    if isinstance(value, float):
        return "; write a whole number"
    return ""


def _reportable(exc: ValidationError) -> list[Any]:
    """The errors worth reporting: for a mode table, its own errors, not "not a string"."""
    errors = exc.errors()
    as_table = [e for e in errors if not (e["type"] == "string_type" and "str" in e["loc"])]
    return as_table or errors


def parse_plan(text: str, source: str = "plan.toml") -> Plan:
    """Validate plan TOML ``text``; errors name ``source``, the key and the fix."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"{source}: not valid TOML: {exc}") from exc
    if "modes" not in data:
        raise PlanError(f'{source}: modes is missing; list them, e.g. modes = ["native", "host"]')
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        errors = _reportable(exc)
        err = errors[0]
        msg = err["msg"].removeprefix("Value error, ")
        extra = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        where = f"{_location(err['loc'])}{_given(err.get('input'), msg)}"
        msg += _type_fix(err)
        raise PlanError(f"{source}: {where}: {msg}{extra}") from exc
    _check_names(plan, source)
    _check_size(plan, source)
    return plan


def decode_plan(data: bytes, source: str) -> str:
    """The text of plan bytes, which must be UTF-8 (PlanError naming the first bad byte)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PlanError(
            f"{source}: not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} "
            f"(line {line}); save the plan as UTF-8"
        ) from exc


def load_plan(path: Path) -> tuple[str, Plan]:
    """The text and validated plan of the TOML file at ``path``."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise PlanError(f"cannot read plan {path}: {exc.strerror}") from exc
    text = decode_plan(data, str(path))
    return text, parse_plan(text, str(path))


def missing_cpus(plan: Plan) -> list[int]:
    """CPUs of the plan's quota that this process cannot run on here (none: it fits)."""
    return sorted(set(parse_cpus(plan.quota.cpus)) - os.sched_getaffinity(0))


def check_runs_here(plan: Plan, source: str) -> None:
    """PlanError unless this host has every CPU of the plan's quota (``run`` runs it here)."""
    if missing := missing_cpus(plan):
        raise PlanError(
            f"{source}: quota.cpus {json.dumps(plan.quota.cpus)} names CPUs this host does not "
            f"have ({format_cpus(missing)}); it has {format_cpus(os.sched_getaffinity(0))}"
        )


def format_cpus(cpus: Iterable[int]) -> str:
    """CPU numbers as a cpuset list, runs folded: ``0-3,6``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def preset_text(name: str) -> str:
    """The TOML text of preset ``name`` (``smoke``, ``reference`` or ``full``)."""
    from worker.modes import BUILTIN_MODES

    if name not in PRESETS:
        raise PlanError(
            f"'{name}' is not a preset{near(name, list(PRESETS))} (presets: {', '.join(PRESETS)})"
        )
    if name in ("full", "reference"):
        chosen = [m for m, info in BUILTIN_MODES.items() if name == "full" or info.reference]
        modes = ", ".join(f'"{m}"' for m in chosen)
        return FULL_TEMPLATE.format(modes=modes, name=name, what=PRESET_WHAT[name])
    subset = ", ".join(f'"{w}"' for w in SMOKE_VM_WORKLOADS)
    modes = ",\n".join(
        f'  {{ name = "{m.name}", workloads = [{subset}] }}' if m.boots_guest else f'  "{m.name}"'
        for m in BUILTIN_MODES.values()
    )
    names = ", ".join(SMOKE_VM_WORKLOADS)
    return SMOKE_TEMPLATE.format(modes=modes, scale=SMOKE_SCALE, subset=names)


def preset(name: str) -> tuple[str, Plan]:
    """The text and validated plan of preset ``name``."""
    text = preset_text(name)
    return text, parse_plan(text, f"preset '{name}'")


SMOKE_TEMPLATE = """\
# sandbench preset 'smoke': a first look in a few minutes on one machine.
# Every built-in mode is planned; a mode whose preflight fails here runs nothing and is
# reported as preflight failed.
name = "smoke"
cohort = "smoke"
seed = 1
environments = 3
rounds = 3
limit_s = 90
scale = {scale}
workloads = ["all"]
modes = [
{modes},
]
notes = [
  "Smoke preset: sizes scaled by {scale}.",
  "VM modes run only: {subset} (a guest boots per environment, tens of seconds under TCG).",
  "The full preset runs every workload in every mode at full size.",
]
"""

PRESET_WHAT = {
    "reference": "the reference study's nine modes, every workload at the design's sizes",
    "full": "every built-in mode, every workload at the design's sizes",
}
FULL_TEMPLATE = """\
# sandbench preset '{name}': {what}.
name = "{name}"
cohort = "{name}"
seed = 1
environments = 3
rounds = 3
limit_s = 90
scale = 1.0
workloads = ["all"]
modes = [{modes}]
"""
