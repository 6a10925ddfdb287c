"""``sandbench compare A B``: two result sets of one cohort, per host and cell, in four formats.

Output: a terminal table (default), ``--json``, ``--csv`` (both on stdout, durations in
seconds) and ``--html FILE`` (a self-contained page: tables, a ratio figure, what was not
compared). A refused comparison (cohorts, hosts, different work) exits 2 with the reason.
Each side's records are stated verified or ``unverified: why``; with a side unverified no cell
gets a verdict, its ratio is marked ``unverified``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from coordinator.cli.campaign import DATA_OPTION, REGISTRY_OPTION, print_report_table
from coordinator.plan.sentinel import MASK_FRACTION
from coordinator.results import plots
from coordinator.results.compare import (
    EXPLORATORY,
    UNVERIFIED,
    Cell,
    Comparison,
    aa_noise,
    compare,
    load_side,
)
from coordinator.results.report import Block, Table, to_html
from coordinator.results.units import UNIT_RULE, duration, fmt, unit_for
from coordinator.store.store import Store
from coordinator.store.trust import HostRegistry

RATIO_TEXT = "ratio = B / A (below 1: B is faster; above 1: B is slower)"
MASK_RULE = (
    "a faster or slower verdict is withheld when the drift of a resource the cell's workload "
    f"uses goes the cell's way and its |log drift| is at least {MASK_FRACTION:g} x the cell's "
    "|log ratio|"
)
CSV_COLUMNS = ["host", "cohort", "workload", "mode_a", "mode_b", "n_a", "n_b", "median_a_s",
               "median_b_s", "ratio", "ratio_low", "ratio_high", "verdict", "why"]  # fmt: skip


def host_tables(c: Comparison) -> list[tuple[str, Table, list[Cell]]]:
    """One table per (host, cohort): its compared cells, and the cells not compared as notes."""
    found = [(x.host, x.cohort) for x in c.cells] + [(e.host, e.cohort) for e in c.excluded]
    keys = list(dict.fromkeys(found))
    out = []
    for host, cohort in keys:
        cells = [x for x in c.cells if (x.host, x.cohort) == (host, cohort)]
        table = Table(
            f"host {host}, cohort {cohort}: median environment task time of A and B, {RATIO_TEXT}; "
            f"{UNIT_RULE}",
            ["workload", "mode A → B", "N A / B", "median A", "median B", "ratio",
             "95% interval", "verdict"], [])  # fmt: skip
        for x in cells:
            unit = unit_for([x.median_a, x.median_b])
            interval = f"[{fmt(x.low, 3)}, {fmt(x.high, 3)}]" if x.low is not None else "—"
            table.rows.append([x.workload, _modes(x.mode_a, x.mode_b), f"{x.n_a} / {x.n_b}",
                               f"{unit.show(x.median_a)} {unit.name}",
                               f"{unit.show(x.median_b)} {unit.name}", fmt(x.ratio, 3),
                               interval, x.verdict])  # fmt: skip
        for e in c.excluded:
            if (e.host, e.cohort) == (host, cohort):
                table.notes.append(f"not compared: {_modes(e.mode_a, e.mode_b)} / "
                                   f"{e.workload}: {e.why}")  # fmt: skip
        out.append((f"host {host}, cohort {cohort}", table, cells))
    return out


def _modes(a: str, b: str) -> str:
    return a if a == b else f"{a} → {b}"


def header_lines(c: Comparison) -> list[str]:
    """What is compared with what, how, and what else differs."""
    lines = [f"A = {c.a}; B = {c.b}; {RATIO_TEXT}",
             ("per cell complete on both sides; both N >= 10: exact 95% Hodges-Lehmann interval "
              "of the ratio (rank-based) and a verdict; otherwise exploratory (the ratio alone)"),
             f"interval: {c.interval_covers}",
             f"records of A: {c.records_a}", f"records of B: {c.records_b}"]  # fmt: skip
    for host, found in c.sentinel.items():
        shown = ", ".join(
            f"{r.workload} {r.ratio:.3g}x ({duration(r.median_a)} -> "
            f"{duration(r.median_b)}, {r.n_a} / {r.n_b} points)"
            for r in found
        )
        drift = c.drifts[host]
        lines.append(f"sentinel B / A on host {host}: {shown}; machine drift {drift.ratio:.3g}x "
                     f"(the farthest from 1): {MASK_RULE}")  # fmt: skip
    for host, spreads in c.aa_noise.items():
        lines.append(f"A/A spread between campaigns on host {host}: {'; '.join(spreads)}")
    for host in c.no_sentinel:
        lines.append(f"no machine-state sentinel measured on host {host} (on one side or both): "
                     "between two campaigns, any shift of the machine itself is part of every "
                     "ratio")  # fmt: skip
    return lines + [f"note: {n}" for n in c.notes]


def to_json(c: Comparison) -> dict[str, Any]:
    """The comparison as one JSON object (durations in seconds)."""
    doc = dataclasses.asdict(c)
    doc["ratio_definition"] = "median B / median A"
    return doc


def to_csv(c: Comparison) -> str:
    """One CSV row per cell, compared or not (a cell not compared: empty numbers, its why)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    for x in c.cells:
        row = dataclasses.asdict(x)
        row["median_a_s"], row["median_b_s"] = row.pop("median_a"), row.pop("median_b")
        row["ratio_low"], row["ratio_high"] = row.pop("low"), row.pop("high")
        w.writerow(row)
    for e in c.excluded:
        w.writerow({**dataclasses.asdict(e), "verdict": "not compared"})
    return buf.getvalue()


def html_blocks(c: Comparison) -> list[Block]:
    """The comparison as report blocks: a section per host with its table and ratio figure."""
    blocks: list[Block] = [("h1", f"sandbench compare: {c.a} vs {c.b}"),
                           ("ul", header_lines(c))]  # fmt: skip
    for title, table, cells in host_tables(c):
        blocks += [("h2", f"Comparison, {title}"), ("table", table)]
        rows = [(f"{_modes(x.mode_a, x.mode_b)} / {x.workload}", x.ratio, x.low, x.high,
                 x.verdict) for x in cells]  # fmt: skip
        plot = plots.ratio_plot(rows, f"Ratio B / A: {title}")
        blocks += [("plot", plot)] if plot else []
    if not c.cells and not c.excluded:
        blocks.append(("p", "No cell is present on both sides."))
    return blocks


@click.command("compare")
@click.argument("side_a", metavar="A")
@click.argument("side_b", metavar="B")
@DATA_OPTION
@REGISTRY_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print one CSV row per cell.")
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write a self-contained HTML page.")  # fmt: skip
@click.option("--aa", "aa_ids", metavar="ID,ID[,ID...]",
              help="A/A campaigns of the host (one configuration, run back to back): the "
                   "interval between A and B adds the spread they show per workload.")  # fmt: skip
def compare_command(side_a: str, side_b: str, data_dir: Path, registry_path: Path | None,
                    as_json: bool, as_csv: bool, html_path: Path | None,
                    aa_ids: str | None) -> None:  # fmt: skip
    """Compare B with A per host and cell: medians, ratio B / A, interval and verdict.

    A and B are campaign ids (or campaign directories), or ID:MODE for one mode of a campaign.
    """
    if as_json and as_csv:
        raise click.UsageError("--json and --csv print to stdout: give one of them")
    store, registry = Store(data_dir), HostRegistry(registry_path)
    a, b = load_side(store, side_a, registry), load_side(store, side_b, registry)
    noise = None
    if aa_ids is not None:
        ids = [x.strip() for x in aa_ids.split(",") if x.strip()]
        noise = aa_noise([load_side(store, x, registry) for x in ids], a)
    result = compare(a, b, noise)
    if html_path is not None:
        html_path.write_text(to_html(html_blocks(result)))
    if as_json:
        click.echo(json.dumps(to_json(result), indent=1))
    elif as_csv:
        click.echo(to_csv(result), nl=False)
    else:
        _print(result)
    if html_path is not None and not (as_json or as_csv):
        click.echo(f"wrote {html_path}")


def _print(c: Comparison) -> None:
    """The terminal view: header, one table per host, what was not compared."""
    console = Console(width=160) if not sys.stdout.isatty() else Console()
    for line in header_lines(c):
        click.echo(line)
    for _, table, cells in host_tables(c):
        print_report_table(table, console)
        if any(x.verdict == EXPLORATORY for x in cells):
            click.echo("exploratory: N < 10 on a side; the ratio alone, no interval, no verdict")
        if any(x.verdict == UNVERIFIED for x in cells):
            click.echo(f"unverified: {c.no_verdict}; the ratio as measured")
    if not c.cells and not c.excluded:
        click.echo("no cell is present on both sides")


def register(main: click.Group) -> None:
    """Attach ``compare`` to ``main``."""
    main.add_command(compare_command)
