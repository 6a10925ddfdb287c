"""``sandbench modes list``: every mode with its preflight verdict on this host."""

from __future__ import annotations

import json
from typing import Any, TypedDict

import click

from contract.errors import SandbenchError
from worker.modes import HostInfo, get_mode, mode_names

COMMAND_VERDICT = "defined by a command template in a plan (preflight checks its binary)"


class ModeVerdict(TypedDict):
    """A line of ``sandbench modes list``: ``ok`` is None for the command mode (a template)."""

    name: str
    ok: bool | None
    reason: str
    facts: dict[str, Any]  # the mode's own facts (tool versions, accelerator, image id)


def mode_verdicts(host: HostInfo | None = None) -> list[ModeVerdict]:
    """Name, verdict, reason and facts of every built-in mode, plus the command mode."""
    host = host or HostInfo()
    rows: list[ModeVerdict] = []
    for name in mode_names():
        try:
            preflight = get_mode(name).preflight(host)
        except SandbenchError as exc:  # a mode that cannot even load says why
            rows.append(ModeVerdict(name=name, ok=False, reason=str(exc), facts={}))
            continue
        rows.append(ModeVerdict(name=name, ok=preflight.ok, reason=preflight.reason,
                                facts=preflight.facts))  # fmt: skip
    rows.append(ModeVerdict(name="command", ok=None, reason=COMMAND_VERDICT, facts={}))
    return rows


@click.group("modes")
def modes_group() -> None:
    """Execution modes and whether they can run here."""


@modes_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def list_modes(as_json: bool) -> None:
    """Every mode with its preflight verdict on this host."""
    rows = mode_verdicts()
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    for row in rows:
        verdict = {True: "ok", False: "unavailable", None: "template"}[row["ok"]]
        facts = ", ".join(f"{k}={v}" for k, v in row["facts"].items() if v is not None)
        why = row["reason"] or facts
        click.echo(f"{row['name']:<14} {verdict:<12} {why}")


def register(main: click.Group) -> None:
    """Attach ``modes`` to the main group."""
    main.add_command(modes_group)
