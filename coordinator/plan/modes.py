"""The plan's modes: each a built-in mode or a command mode, named uniquely and honestly.

A mode table is a built-in mode's name, with the ``options`` that mode declares taking
(``Mode.option_names``, e.g. the VM modes' ``accel``), or a command mode: a ``template`` and
the command mode's own keys (``COMMAND_KEYS``) under a name of its own. A command mode may not
take a built-in mode's name (its records would pass for that mode's), and no two modes of a
plan share a name; the refusal suggests a free one.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from contract.errors import ModeUnavailable, PlanError
from contract.names import Name, is_name

if TYPE_CHECKING:
    from worker.modes.base import Mode

# A command mode's own keys: a built-in mode takes none of them.
COMMAND_KEYS = ("staged", "root", "result_root", "prepare", "sync", "collect", "cleanup")


class ModeEntry(BaseModel):
    """One mode of the plan: a built-in name, or a command-template mode."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Name  # becomes part of file and cgroup names
    template: list[str] | str | None = None  # command mode: argv (or shell string), placeholders
    staged: bool = False  # command mode only: works on a copy
    root: str | None = None  # command mode: the workspace path as the payload sees it
    result_root: str | None = None  # command mode: where the oracle looks
    prepare: list[str] | str | None = None  # command mode helpers, each must exit 0
    sync: list[str] | str | None = None
    collect: list[str] | str | None = None  # command mode: after the launcher, before the oracle
    cleanup: list[str] | str | None = None
    workloads: list[str] | None = None  # subset for this mode (names or groups); None = plan's
    options: dict[str, Any] = Field(default_factory=dict)  # a built-in mode's option_names

    def mode_options(self) -> dict[str, Any]:
        """What the runner's ``get_mode(name, options)`` receives."""
        opts = dict(self.options)
        if self.template is not None:
            opts.update(template=self.template, staged=self.staged)
            for name in ("root", "result_root", "prepare", "sync", "collect", "cleanup"):
                if getattr(self, name) is not None:
                    opts[name] = getattr(self, name)
        return opts


def near(name: str, choices: list[str]) -> str:
    """``; did you mean 'x'?`` for the closest of ``choices``, or nothing."""
    close = difflib.get_close_matches(name, choices, n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def check_modes(entries: list[ModeEntry], source: str) -> None:
    """PlanError naming the first mode table that is not a usable mode of the plan."""
    from worker.modes import BUILTIN_MODES

    check_mode_names(entries, source)
    for i, entry in enumerate(entries):
        where = f"{source}: modes[{i}] '{entry.name}'"
        if entry.template is None and entry.name not in BUILTIN_MODES:
            raise PlanError(
                f"{where} is not a mode{near(entry.name, list(BUILTIN_MODES))} (or give it a "
                "template to make it a command mode)"
            )
        if entry.template is not None:
            check_templates(entry, where)
        check_mode_keys(entry, where)


def check_mode_names(entries: list[ModeEntry], source: str) -> None:
    """Each mode once; a command mode under a name of its own, not a built-in mode's."""
    from worker.modes import BUILTIN_MODES

    taken = {entry.name for entry in entries}
    first: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = f"{source}: modes[{i}] '{entry.name}'"
        if entry.template is not None and entry.name in BUILTIN_MODES:
            raise PlanError(
                f"{where} is a command mode under the name of the built-in mode '{entry.name}' "
                "(its records would pass for that mode's); rename it: did you mean "
                f"'{free_name(entry, taken)}'?"
            )
        if entry.name in first:
            fix = (
                f"rename it: did you mean '{free_name(entry, taken)}'?"
                if entry.template is not None
                else "list each built-in mode once"
            )
            raise PlanError(f"{where} appears twice (first as modes[{first[entry.name]}]); {fix}")
        first[entry.name] = i


def free_name(entry: ModeEntry, taken: set[str]) -> str:
    """A name for command mode ``entry`` that no built-in mode and no mode of the plan has: its
    program's (``runsc`` for ``["runsc", "do", ...]``), else its own with ``-command``."""
    from worker.modes import BUILTIN_MODES

    template = entry.template
    words = template.split() if isinstance(template, str) else list(template or [])
    program = words[0].rsplit("/", 1)[-1] if words else ""
    candidates = [program, f"{entry.name}-command"]
    candidates += [f"{entry.name}-command-{n}" for n in range(2, len(taken) + 3)]
    return next(
        c for c in candidates
        if is_name(c) and c not in BUILTIN_MODES and c not in taken and c != "command"
    )  # fmt: skip


def check_mode_keys(entry: ModeEntry, where: str) -> None:
    """A built-in mode gets no command-mode key and only the options it declares taking."""
    given = [k for k in COMMAND_KEYS if k in entry.model_fields_set]
    if entry.template is None and given:
        raise PlanError(
            f"{where}: {given[0]} is a command mode's key, and a built-in mode takes none; "
            "drop it (or give the mode a template and a name of its own)"
        )
    if not entry.options:
        return
    if entry.template is not None:
        raise PlanError(
            f"{where}: options: a command mode takes none; its keys ({', '.join(COMMAND_KEYS)}) "
            "go in the mode's table itself"
        )
    mode = mode_class(entry.name, where)
    takes = sorted(mode.option_names)
    for option in entry.options:
        if option not in mode.option_names:
            raise PlanError(
                f"{where}: options.{option} is not an option of this mode{near(option, takes)} "
                f"(it takes {', '.join(takes) or 'none'})"
            )
    try:
        mode.from_options(entry.options)  # the mode's own check of the values
    except ModeUnavailable as exc:
        raise PlanError(f"{where}: options: {exc}") from exc


def mode_class(name: str, where: str) -> type[Mode]:
    """The class of built-in mode ``name``, loaded without building the mode."""
    from worker.modes import mode_class as load

    try:
        return load(name)
    except ModeUnavailable as exc:
        raise PlanError(f"{where}: {exc}") from exc


def check_templates(entry: ModeEntry, where: str) -> None:
    """A command mode's templates are well formed: PlanError naming the first that is not."""
    from worker.modes.command import options_problems

    problems = options_problems(entry.mode_options())
    if problems:
        field, problem = problems[0]
        raise PlanError(f"{where}: {field} {problem}")
