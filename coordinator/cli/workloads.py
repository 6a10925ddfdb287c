"""``sandbench workloads list``: every declared workload, its group and full-scale parameters."""

from __future__ import annotations

import json

import click

from workloads.registry import WORKLOADS


def _human(value: int, key: str) -> str:
    """A parameter value for people: byte sizes in KiB/MiB/GiB, counts as they are."""
    if not key.endswith("_bytes"):
        return str(value)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return f"{value} B"


@click.group("workloads")
def workloads_group() -> None:
    """The file workloads (as declared in workloads/)."""


@workloads_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def list_workloads(as_json: bool) -> None:
    """List every workload: number, name, group, summary and full-scale parameters."""
    rows = [w.describe() for w in WORKLOADS.values()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        params = ", ".join(f"{k}={_human(v, k)}" for k, v in row["params"].items())
        click.echo(f"{row['number']:>2}  {row['name']:<18} {row['group']:<10} {row['summary']}")
        click.echo(f"{'':34}{params}")


def register(main: click.Group) -> None:
    """Attach ``workloads`` to the top-level command."""
    main.add_command(workloads_group)
