"""The report of a campaign, rebuilt from raw records: results.csv per host, report.md/.html, plots.

Every table is of one host and one cohort. An incomplete cell shows ``—`` with a note number;
the note, one line below the table, says why (failure, rule, preflight, pending).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from contract.errors import SandbenchError, StoreError
from contract.names import check_name
from coordinator.plan.campaign import format_size
from coordinator.plan.sentinel import MASK_FRACTION, SentinelTable
from coordinator.results import plots
from coordinator.results.analysis import (
    CELL_COLUMNS,
    Analysis,
    HostTables,
    analyze_stored,
    flatten_facts,
)
from coordinator.results.trend import ALPHA, MIN_N, MIN_POINTS, Trend, cell_trends
from coordinator.results.units import MISSING, UNIT_RULE, Unit, duration, fmt, unit_for
from coordinator.results.walltime import cost_rows
from coordinator.store.store import Campaign, Store
from coordinator.store.trust import HostRegistry
from coordinator.store.verdict import verdict_of
from coordinator.store.views import CampaignView
from worker.hostinfo import NO_JOURNAL, NO_JOURNAL_WARNING
from workloads.registry import WORKLOADS

# The report's sections, in order: a workload's declaration names its section (its
# ``section``); anything else (a workload no longer declared) is shown under "other".
SECTION_TITLES = {
    "workflows": "Task completion per workflow and mode",
    "writes": "Small writes and synchronization",
    "reads": "Reads and metadata",
    "resource": "Working set and concurrency",
    "other": "Other workloads",
}
CSV_FLOAT = "%.6f"
TASK_UNIT = (
    "median environment task time (environment = sum of its rounds; median over N; "
    f"[95% bootstrap interval] when N >= 10, P95 when N >= 30); {UNIT_RULE}, "
    "the unit after the workload's name"
)
CSS = """body{font:14px/1.45 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #bbb;padding:2px 7px}
td.num{text-align:right;font-variant-numeric:tabular-nums}td.missing{text-align:center;color:#a00}
p.cap{font-style:italic;margin:.8em 0 .2em}ol.notes{font-size:12px;color:#444;margin-top:0}
svg{max-width:100%;height:auto}figure{margin:1em 0}figcaption{font-size:12px;color:#444}
.bad{color:#a00;font-weight:bold}.ok{color:#070}"""
# What a plan's text could make Markdown of, inline in a list item of one line: emphasis, code,
# links, raw HTML and entities, table cells, strikethrough, math.
MARKDOWN_SPECIAL = "\\`*_[]<|~$&"


class PlainText(str):
    """Text from the plan (its notes), shown as written: one line, never Markdown."""

    __slots__ = ()

    @classmethod
    def of(cls, text: str) -> PlainText:
        """``text`` folded to one line (every run of white space, newlines too, one space)."""
        return cls(" ".join(text.split()))


def markdown_plain(text: str) -> str:
    """``text`` with every Markdown-significant character escaped, so it renders as itself."""
    return "".join(f"\\{c}" if c in MARKDOWN_SPECIAL else c for c in text)


@dataclass
class Table:
    """A titled table; a cell that is an ``int`` in ``missing`` columns refers to a note."""

    caption: str
    header: list[str]
    rows: list[list[str | tuple[str, int]]]  # (text, note number) for an incomplete cell
    notes: list[str] = field(default_factory=list)


Block = tuple[str, Any]  # ("h1"|"h2"|"h3"|"p"|"ul"|"table"|"plot", payload)


def cell_table(t: HostTables, workloads: list[str], caption: str) -> Table | None:
    """Workloads (rows) x modes (columns): median task time, '—' + note when incomplete."""
    cells = t.cells[t.cells["workload"].isin(workloads)]
    if cells.empty:
        return None
    modes = list(dict.fromkeys(cells["mode"]))
    table = Table(caption, ["workload", *modes], [])
    by_key = {(r.mode, r.workload): r for r in cells.itertuples()}
    for w in [w for w in workloads if w in set(cells["workload"])]:
        found = [r for r in (by_key.get((m, w)) for m in modes) if r is not None]
        values = [v for r in found for v in (r.task_s_median, r.task_s_ci_high, r.task_s_p95)]
        unit = unit_for(values)
        shown = any(unit.show(v) != MISSING for v in values)  # a row of dashes has no unit
        row: list[str | tuple[str, int]] = [f"{w} ({unit.name})" if shown else w]
        for m in modes:
            r = by_key.get((m, w))
            if r is None:
                row.append("not planned")
            elif r.status == "complete":
                row.append(_median_text(r, unit))
            else:
                table.notes.append(f"{m} / {w}: {r.reason}")
                row.append((MISSING, len(table.notes)))
        table.rows.append(row)
    return table


def _median_text(r: Any, unit: Unit) -> str:
    """Median, with its 95% interval (N >= 10) and P95 (N >= 30) when the cell has them."""
    text = unit.show(r.task_s_median)
    if unit.show(r.task_s_ci_low) != MISSING:
        text += f" [{unit.show(r.task_s_ci_low)}, {unit.show(r.task_s_ci_high)}]"
    if unit.show(r.task_s_p95) != MISSING:
        text += f" P95 {unit.show(r.task_s_p95)}"
    return text


def _sections(t: HostTables) -> dict[str, list[str]]:
    """The host's workloads by report section (as declared), in the table's order."""
    order = list(dict.fromkeys(t.cells["workload"]))
    section = {name: w.section for name, w in WORKLOADS.items()}
    return {key: [w for w in order if section.get(w, "other") == key] for key in SECTION_TITLES}


def headline(t: HostTables, workflows: list[str]) -> list[str]:
    """One sentence per workflow: the fastest complete mode and every other mode relative to it."""
    out = []
    for w in workflows or list(dict.fromkeys(t.cells["workload"]))[:3]:
        c = t.cells[t.cells["workload"] == w]
        done = c[c["status"] == "complete"].sort_values("task_s_median", kind="stable")
        if done.empty:
            out.append(f"{w}: no mode completed all environments.")
            continue
        best = done.iloc[0]
        others = ", ".join(
            f"{r.mode} {r.task_s_median / best.task_s_median:.2f}x"
            for r in done.iloc[1:].itertuples()
        )
        missing = ", ".join(c[c["status"] != "complete"]["mode"])
        text = f"{w}: fastest mode '{best['mode']}' at {duration(best['task_s_median'])}"
        text += f"; relative to it: {others}" if others else ""
        text += f"; incomplete: {missing}" if missing else ""
        out.append(text + ".")
    return out


def startup_table(t: HostTables) -> Table:
    """Host ``t``'s Ready table: per mode, N and the min, median and max Ready in ms."""
    rows: list[list[str | tuple[str, int]]] = [
        [str(r.mode), str(r.n), fmt(r.ready_ms_min), fmt(r.ready_ms_median), fmt(r.ready_ms_max)]
        for r in t.startup.itertuples()
    ]
    return Table(
        "Ready per mode, ms (over passed environments)", ["mode", "n", "min", "median", "max"], rows
    )


def _coverage_table(t: HostTables) -> Table:
    labels = {
        "planned": "planned environments", "ran": "ran", "passed": "passed", "failed": "failed",
        "not_run_rule": "not run (first-failure rule)", "not_run_preflight": "not run (preflight)",
        "pending": "no record yet", "cells": "cells", "complete_cells": "complete cells",
        "valid_rounds": "valid round records",
        "superseded_records": "superseded records (kept, not counted)",
    }  # fmt: skip
    return Table(
        "Coverage (counts)", ["what", "count"], [[labels[k], str(v)] for k, v in t.coverage.items()]
    )


def _failures_table(t: HostTables) -> Table:
    rows: list[list[str | tuple[str, int]]] = [
        [str(r.mode), str(r.workload), str(r.env_index), str(r.attempt), str(r.failure_class),
         str(r.reason), str(r.detail or "")[:200]]
        for r in t.failures.itertuples()
    ]  # fmt: skip
    return Table(
        "Failed environments",
        ["mode", "workload", "env", "attempt", "class", "reason", "detail"],
        rows,
    )


def _missing_list(t: HostTables) -> list[str]:
    inc = t.cells[t.cells["status"] != "complete"]
    return [f"{r.mode} / {r.workload}: {r.reason}" for r in inc.itertuples()]


def sentinel_blocks(s: SentinelTable | None, every: int, stem: Path) -> list[Block]:
    """The machine-state sentinel of one host: what ran, its share of the time, its drift."""
    if s is None:
        return [("h3", "Machine-state sentinel"),
                ("p", ("No sentinel in this campaign (planned with sentinel = false, or before "
                      "the sentinel existed): a comparison with another campaign cannot tell "
                      "the machine's own drift."))]  # fmt: skip
    points = s.points
    planned = int(points["env_index"].nunique())
    share = "not known yet" if s.share is None else (
        f"{s.share:.2%} ({duration(s.sentinel_wall_s)} of {duration(s.wall_s)})")  # fmt: skip
    rows: list[list[str | tuple[str, int]]] = []
    for w, g in points.groupby("workload", sort=False):
        ok = g.loc[g["status"] == "passed", "task_s"]
        unit = unit_for(list(ok))
        spread = f"{ok.max() / ok.min():.3g}" if len(ok) and ok.min() > 0 else MISSING
        rows.append([f"{w} ({unit.name})", f"{len(ok)} / {len(g)}", unit.show(ok.median()),
                     unit.show(ok.min()), unit.show(ok.max()), spread])  # fmt: skip
    header = ["calibration", "passed / planned", "median", "min", "max", "max / min"]
    table = Table("Sentinel task time per calibration environment (sum of its rounds)", header,
                  rows)  # fmt: skip
    bad = points[points["status"] != "passed"]
    blocks: list[Block] = [
        ("h3", "Machine-state sentinel"),
        ("p", (f"Calibration environments (native, fixed work; in no cell: not in the tables "
              f"above, results.csv or the coverage counts): {planned} points, at the start, "
              f"every {every} environments and at the end. Their share of the environments' "
              f"wall time: {share}.")),
        ("table", table),
    ]  # fmt: skip
    plot = plots.sentinel_drift(s, stem)
    blocks += [("plot", plot)] if plot else []
    if len(bad):
        blocks.append(("ul", [f"{r.workload} #{r.env_index}: {r.status}"
                              f"{f' ({r.reason})' if isinstance(r.reason, str) else ''}"
                              for r in bad.itertuples()]))  # fmt: skip
    return blocks


def trend_blocks(
    t: HostTables, journal: str | None = None, sentinel: SentinelTable | None = None
) -> list[Block]:
    """Drift inside the campaign (``coordinator.results.trend``): each cell's change over the run
    order, workloads x modes, "(sig.)" where it is significant after Holm's correction, and for
    those whether the host's ``sentinel`` moved with it; with a warning when the work root was
    ``journal`` = ext4 without a journal (the host's fact)."""
    found = cell_trends(t.environments, None if sentinel is None else sentinel.points)
    if not found:
        return []
    warning: list[Block] = []
    if journal == NO_JOURNAL:
        warning = [("p", NO_JOURNAL_WARNING)]
    modes = list(dict.fromkeys(x.mode for x in found))
    by_key = {(x.mode, x.workload): x for x in found}
    table = Table(
        "Change of each cell's task time from its first environment to its last in the run "
        f"order (Theil-Sen slope x span / median); (sig.): significant (Spearman permutation test, "
        f"Holm-corrected over the {sum(x.p is not None for x in found)} cells tested, "
        f"{ALPHA:.0%}); (sig., machine): and the sentinel moved with it (below); cells with fewer "
        f"than {MIN_N} passed environments are not tested",
        ["workload", *modes], [])  # fmt: skip
    for w in dict.fromkeys(x.workload for x in found):
        row: list[str | tuple[str, int]] = [w]
        for m in modes:
            x = by_key.get((m, w))
            row.append("" if x is None else f"{x.change:+.0%}{_trend_mark(x)}")
        table.rows.append(row)
    flagged = [x for x in found if x.significant]
    tested = sum(x.p is not None for x in found)
    if flagged:
        named = ", ".join(f"{x.mode} / {x.workload} ({x.change:+.0%})" for x in flagged)
        verdict = (f"{len(flagged)} of the {tested} cells tested drift significantly: {named}. "
                   "Their spread includes the drift; between two campaigns it is part of the "
                   f"ratio. {_machine_sentence(flagged, sentinel)}")  # fmt: skip
    elif tested:
        verdict = f"No cell of the {tested} tested drifts significantly."
    else:
        verdict = (f"No cell has the {MIN_N} passed environments a trend test needs: the changes "
                   "are shown, untested.")  # fmt: skip
    return [("h3", "Drift inside the campaign"), ("p", verdict), *warning, ("table", table)]


def _trend_mark(x: Trend) -> str:
    """A table cell's mark: significant, and moved with the machine."""
    if not x.significant:
        return ""
    return " (sig., machine)" if x.explained else " (sig.)"


def _machine_sentence(flagged: list[Trend], sentinel: SentinelTable | None) -> str:
    """What the sentinel did over the flagged cells' spans (``Trend.machine``)."""
    if sentinel is None:
        return "No sentinel ran in this campaign: whether the machine moved with them is unknown."
    known = [x for x in flagged if x.machine is not None]
    if not known:
        return (f"The sentinel has fewer than {MIN_POINTS} passed points of a calibration "
                "their workloads use: whether the machine moved with them is unknown.")  # fmt: skip
    explained = [x for x in known if x.explained]
    parts = []
    if explained:
        shown = "; ".join(f"{x.mode} / {x.workload}: {x.machine_text()}" for x in explained)
        parts.append(
            f"{len(explained)} moved with the sentinel: over the same span its calibration of a "
            "resource their workload uses went the same way by at least "
            f"{MASK_FRACTION:.0%} of their change (log terms), so the host itself changed (the "
            "machine's speed; for fsync and metadata also the file system's state, which earlier "
            f"environments' deletions change too), not the modes ({shown})")  # fmt: skip
    others = [x for x in flagged if not x.explained]
    if others:
        shown = "; ".join(f"{x.mode} / {x.workload}: "
                          f"{x.machine_text() or 'no calibration of its resources'}"
                          for x in others)  # fmt: skip
        parts.append(f"{len(others)} did not move with it, so the sentinel does not explain "
                     f"them (its largest change over their span: {shown})")  # fmt: skip
    return ". ".join(parts) + "."


# What each mode ran on a host, named next to the mode (the provenance's preflight facts): the
# runtime and its version, platform and flags, the accelerator, the workspace's transport.
MODE_FACTS = (
    "runtime", "runsc", "platform", "runsc_flags", "nsjail", "bwrap", "dockerd_version",
    "cgroup_driver", "accel", "machine", "workspace", "virtiofsd", "virtiofs_cache",
)  # fmt: skip


def mode_summary(facts: dict[str, Any]) -> str:
    """One line of what a mode ran here, or why it did not run."""
    if not facts.get("ok", True):
        return f"preflight failed: {facts.get('reason', '')}"
    shown = [_fact(key, str(facts[key])) for key in MODE_FACTS if facts.get(key) not in (None, "")]
    return "; ".join(shown) or "-"


def _fact(key: str, value: str) -> str:
    """``key value``, without the key twice (``runsc version 0.0`` stays as it is)."""
    return value if value.startswith(f"{key} ") else f"{key} {value}"


def modes_table(provenance: dict[str, Any], modes: list[str]) -> Table:
    """The host's modes with what each ran (runsc version, platform and flags; accelerator...)."""
    known = provenance.get("modes") or {}
    rows: list[list[str | tuple[str, int]]] = [
        [m, mode_summary(known[m]) if m in known else "no preflight recorded"] for m in modes
    ]
    return Table("Modes on this host", ["mode", "what ran"], rows)


def host_blocks(
    t: HostTables,
    provenance: dict[str, Any],
    plot_dir: Path,
    sentinel: tuple[SentinelTable | None, int] = (None, 0),
) -> list[Block]:
    """The sections of one host and cohort (with its sentinel and the plan's K)."""
    g = _sections(t)
    slug = f"{check_name(t.host, 'host')}-{check_name(t.cohort, 'cohort')}"  # file names
    blocks: list[Block] = [("h2", f"Host {t.host}, cohort {t.cohort}")]
    modes = list(dict.fromkeys(str(m) for m in t.cells["mode"])) if len(t.cells) else []
    blocks += [("table", modes_table(provenance, modes))]
    for name, title in SECTION_TITLES.items():
        workloads = g[name]
        table = cell_table(t, workloads, TASK_UNIT)
        if table is None:
            continue
        blocks += [("h3", title), ("table", table)]
        plot = plots.task_time_bars(t, workloads, title, plot_dir / f"{slug}-{name}")
        blocks += [("plot", plot)] if plot else []
    mech = g["writes"] + g["reads"]
    heat = plot_dir / f"{slug}-mechanisms-relative"
    plot = plots.relative_heatmap(t, mech, heat) if mech else None
    blocks += [("plot", plot)] if plot else []
    blocks += [("h3", "Ready and the startup range"), ("table", startup_table(t))]
    plot = plots.startup_range(t, plot_dir / f"{slug}-startup")
    blocks += [("plot", plot)] if plot else []
    blocks += sentinel_blocks(*sentinel, plot_dir / f"{slug}-sentinel")
    blocks += trend_blocks(t, provenance.get("work_root_journal"), sentinel[0])
    blocks += cost_blocks(t)
    blocks += [("h3", "Coverage"), ("table", _coverage_table(t))]
    blocks += [("h3", "Failures and missing observations"), ("table", _failures_table(t))]
    blocks += [
        ("p", "Incomplete cells (no median, never zero):"),
        ("ul", _missing_list(t) or ["none"]),
    ]
    prov = Table(
        "Provenance of this host", ["fact", "value"], [[k, v] for k, v in flatten_facts(provenance)]
    )
    blocks += [("h3", "Provenance"), ("table", prov)]
    return blocks


COST_HEADER = ["mode / workload", "n", "measured s", "preparation s", "oracle and checks s",
               "cleanup s", "unmeasured"]  # fmt: skip


def cost_blocks(t: HostTables) -> list[Block]:
    """Where the environments' own time went per mode and workload, most unmeasured first."""
    rows: list[list[str | tuple[str, int]]] = [[*r] for r in cost_rows(t.environments)]
    if not rows:
        return []
    caption = (
        "Seconds of the environments' time, summed per cell: measured (Ready and the rounds), "
        "preparation (fixture, copy, cgroup, the mode's own, sync), oracle and checks (between "
        "the rounds, the exit, the oracle), cleanup; the cells with the most unmeasured time "
        "first, then all cells"
    )
    table = Table(caption, COST_HEADER, rows)
    return [("h3", "Where the time went"), ("table", table)]


def campaign_blocks(
    store: Store, campaign: Campaign | CampaignView, analysis: Analysis, plot_dir: Path,
    registry: HostRegistry | None = None,
) -> list[Block]:  # fmt: skip
    """Every section of the report, host by host."""
    plan = campaign.plan
    status = verdict_of(store, campaign.id, registry).text  # the last verify's, signed, current
    blocks: list[Block] = [
        ("h1", f"sandbench campaign {campaign.id}"),
        ("p", (f"Plan '{plan.get('name')}', cohort {plan.get('cohort')}, seed {plan.get('seed')}, "
              "created "
              f"{campaign.created_at}; hosts: {', '.join(campaign.hosts)}; records: {status}.")),
        ("h2", "Headline"),
    ]  # fmt: skip
    for t in analysis.tables:
        lines = headline(t, _sections(t)["workflows"])
        blocks += [
            (
                "p",
                (
                    f"Host {t.host} (cohort {t.cohort}): median task time of a workflow "
                    "environment (the sum of its rounds), fastest complete mode first:"
                ),
            ),
            ("ul", lines),
        ]
    blocks += [
        ("h2", "Configuration"),
        ("ul", _config_lines(plan) + [PlainText.of(f"note: {n}") for n in plan.get("notes", [])]),
    ]
    every = int(plan.get("sentinel", {}).get("every", 0))
    for t in analysis.tables:
        sentinel = (analysis.sentinel_of(t.host, t.cohort), every)
        blocks += host_blocks(t, store.provenance(campaign.id, t.host), plot_dir, sentinel)
    return blocks


def _mode_text(m: str | dict[str, Any]) -> str:
    if isinstance(m, str):
        return m
    text = str(m["name"])
    text += f" (workloads: {', '.join(m['workloads'])})" if m.get("workloads") else ""
    template = m.get("template")
    template = template if isinstance(template, str) else " ".join(template or [])
    return text + (f" (command: {template})" if template else "")


def _config_lines(plan: dict[str, Any]) -> list[str]:
    modes = [_mode_text(m) for m in plan.get("modes", [])]
    q, vm = plan.get("quota", {}), plan.get("vm", {})
    return [
        (f"environments per cell N = {plan.get('environments')}, "
        f"rounds per environment R = {plan.get('rounds')}, "
        f"limit {plan.get('limit_s')} s, scale {plan.get('scale')}"),
        f"workloads: {', '.join(plan.get('workloads', []))}; modes: {', '.join(modes)}",
        (f"quota: cpus {q.get('cpus')}, {q.get('cpu_quota')} cores, "
        f"memory {format_size(int(q.get('memory', 0)))}, "
        f"swap {format_size(int(q.get('swap', 0)))}; "
        f"VM {vm.get('vcpus')} vCPU / {vm.get('memory_mib')} MiB"),
        _sentinel_config(plan.get("sentinel")),
        ("statistics: N=3 is exploratory (no tails, no intervals); "
        "N>=10 adds a bootstrap 95% interval of "
        "the median [low, high]; N>=30 adds P95; hosts and cohorts are never pooled or ranked"),
    ]  # fmt: skip


def _sentinel_config(setting: dict[str, Any] | None) -> str:
    """The plan's sentinel setting as the configuration lists it."""
    if not setting:
        return "sentinel: none (a campaign planned before the sentinel existed)"
    if not setting.get("every"):
        return "sentinel: off (sentinel = false)"
    return f"sentinel: calibration points at the start, every {setting['every']} environments, end"


# --- rendering ---------------------------------------------------------------------------------
def to_markdown(blocks: list[Block], root: Path) -> str:
    """The report as Markdown (plots linked as relative SVG files, their captions below)."""
    out: list[str] = []
    for kind, payload in blocks:
        if kind in ("h1", "h2", "h3"):
            out += ["#" * int(kind[1]) + " " + payload, ""]
        elif kind == "p":
            out += [payload, ""]
        elif kind == "ul":
            out += [f"- {_md_item(x)}" for x in payload] + [""]
        elif kind == "plot":
            out += [f"![{payload.path.stem}]({payload.path.relative_to(root)})", "",
                    f"*{payload.caption}*", ""]  # fmt: skip
        elif kind == "table":
            out += _md_table(payload)
    return "\n".join(out)


def _md_item(text: str) -> str:
    """A list item's Markdown: the plan's plain text escaped, the report's own as it is."""
    return markdown_plain(text) if isinstance(text, PlainText) else text


def _md_table(t: Table) -> list[str]:
    def cell(c: str | tuple[str, int]) -> str:
        return f"— [{c[1]}]" if isinstance(c, tuple) else str(c).replace("|", "\\|")

    lines = [f"*{t.caption}*", "", "| " + " | ".join(t.header) + " |", "|" + "---|" * len(t.header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in t.rows]
    lines += [""] + [f"[{i}] {n}  " for i, n in enumerate(t.notes, 1)] + [""]
    return lines


def to_html(blocks: list[Block]) -> str:
    """The report as one self-contained HTML page (inline CSS and SVG; opens offline)."""
    body: list[str] = []
    for n, (kind, payload) in enumerate(blocks):
        if kind in ("h1", "h2", "h3"):
            body.append(f"<{kind}>{html.escape(payload)}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{html.escape(payload)}</p>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in payload) + "</ul>")
        elif kind == "plot":
            cap = f"<figcaption>{html.escape(payload.caption)}</figcaption>"
            body.append(f"<figure>{payload.svg}{cap}</figure>")
        elif kind == "table":
            body.append(_html_table(payload, f"t{n}"))
    title = html.escape(blocks[0][1]) if blocks else "sandbench report"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")  # fmt: skip


def _html_table(t: Table, tid: str) -> str:
    def cell(c: str | tuple[str, int]) -> str:
        if isinstance(c, tuple):
            note = html.escape(t.notes[c[1] - 1], quote=True)
            link = f"<a href='#{tid}-n{c[1]}'>—<sup>{c[1]}</sup></a>"
            return f"<td class='missing' title='{note}'>{link}</td>"
        cls = " class='num'" if c[:1].isdigit() else ""
        return f"<td{cls}>{html.escape(str(c))}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.header)
    rows = "".join("<tr>" + "".join(cell(c) for c in row) + "</tr>" for row in t.rows)
    notes = "".join(f"<li id='{tid}-n{i}'>{html.escape(x)}</li>" for i, x in enumerate(t.notes, 1))
    notes_html = f"<ol class='notes'>{notes}</ol>" if notes else ""
    caption = f"<p class='cap'>{html.escape(t.caption)}</p>"
    return f"{caption}<table><tr>{head}</tr>{rows}</table>{notes_html}"


# --- files -------------------------------------------------------------------------------------
def write_results_csv(store: Store, campaign_id: str, analysis: Analysis) -> list[Path]:
    """One results.csv per host: one row per cell (every cohort of the host, never mixed)."""
    paths = []
    for host in sorted({t.host for t in analysis.tables}):
        frames = [t.cells for t in analysis.tables if t.host == host]
        path = store.host_dir(campaign_id, host) / "results.csv"
        pd.concat(frames)[CELL_COLUMNS].to_csv(
            path, index=False, float_format=CSV_FLOAT, lineterminator="\n"
        )
        paths.append(path)
    return paths


@dataclass(frozen=True)
class Written:
    """What ``write_report`` wrote (results CSVs, report.md, report.html, plots) and the
    analysis the tables were made from."""

    results: list[Path]
    markdown: Path
    html: Path
    plots: list[Path]
    analysis: Analysis


def write_report(store: Store, campaign_id: str, registry: HostRegistry | None = None) -> Written:
    """Rebuild every derived file of a campaign from its raw records; returns their paths.

    ``registry``: whose coordinator keys may sign the verdict it shows (default this machine's).
    A campaign it refuses (``StoreError``: a line that is no record, a file that is not JSON)
    keeps no earlier report.md or report.html: they are replaced by a note saying why, and the
    error says so.
    """
    try:
        return _write_report(store, campaign_id, registry)
    except StoreError as exc:
        if not _replace_refused(store, campaign_id, str(exc)):
            raise
        raise StoreError(f"{exc}; the earlier report.md and report.html now say only that no "
                         "report could be built, and why") from exc  # fmt: skip


def _replace_refused(store: Store, campaign_id: str, why: str) -> bool:
    """Replace a refused campaign's existing report.md and report.html by a note saying why no
    report was built (none is written where there was none); whether any was replaced."""
    try:
        root = store.campaign_dir(campaign_id)
    except SandbenchError:
        return False
    pages = [root / name for name in ("report.md", "report.html") if (root / name).is_file()]
    blocks: list[Block] = [
        ("h1", f"sandbench campaign {campaign_id}: no report"),
        ("p", (f"The report could not be built: {why}. An earlier report was here; it is gone "
              "because what it showed is no longer what the store holds. Nothing in this file "
              f"is a result or a verdict: run 'sandbench verify {campaign_id}' to see every "
              "problem.")),
    ]  # fmt: skip
    for page in pages:
        page.write_text(to_markdown(blocks, root) if page.suffix == ".md" else to_html(blocks))
    return bool(pages)


def _write_report(store: Store, campaign_id: str, registry: HostRegistry | None) -> Written:
    """``write_report`` of a campaign the store can read."""
    campaign = store.campaign_view(campaign_id)
    analysis, _ = analyze_stored(store, campaign)
    for host in sorted({t.host for t in analysis.tables}):  # a bad one stops it, nothing written
        store.provenance(campaign_id, host)
    root = store.campaign_dir(campaign_id)
    csvs = write_results_csv(store, campaign_id, analysis)
    blocks = campaign_blocks(store, campaign, analysis, root / "plots", registry)
    (root / "report.md").write_text(to_markdown(blocks, root))
    (root / "report.html").write_text(to_html(blocks))
    plot_files = sorted(p.path for kind, p in blocks if kind == "plot" and p.path is not None)
    _remove_stale_plots(root / "plots", set(plot_files))
    return Written(results=csvs, markdown=root / "report.md", html=root / "report.html",
                   plots=plot_files, analysis=analysis)  # fmt: skip


def _remove_stale_plots(plot_dir: Path, keep: set[Path]) -> None:
    """Drop figures of an earlier build (a cohort or a format that is gone): plots/ is derived."""
    if not plot_dir.is_dir():
        return
    for path in plot_dir.iterdir():
        if path.suffix in (".svg", ".png") and path not in keep:
            path.unlink()
