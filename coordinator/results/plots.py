"""Figures of one host's tables as self-contained SVG: task time with every environment shown,
the startup range, task time relative to the fastest mode.

An incomplete cell stays visibly empty: no bar, no points, a '—' whose tooltip says why.
Durations follow ``coordinator.results.units``: an axis is in ms when every value on it is
below 1 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from coordinator.plan.sentinel import SentinelTable
from coordinator.results import svg
from coordinator.results.analysis import HostTables, passed_values
from coordinator.results.units import MISSING, UNIT_RULE, duration, unit_for

WIDTH = 900.0
LEFT = 72.0
PLOT_H = 220.0
MISSING_COLOR = "#a00"
POINT_COLOR = "#111"
MAX_BAR = 56.0  # pixels: a lone cell's bar stays a bar, not a wall
MANY_POINTS = 30  # above this many environments a cell's points get smaller
ENV_CLASS = "env"  # SVG class of the paths that hold one point per environment


@dataclass
class Plot:
    """One figure: its SVG, its caption and the file it was written to (None if not written)."""

    svg: str
    caption: str
    path: Path | None = None


def save(canvas: svg.Canvas, caption: str, stem: Path | None) -> Plot:
    """The figure of ``canvas``, written to ``stem``.svg when a stem is given."""
    text = canvas.to_svg()
    if stem is None:
        return Plot(text, caption)
    stem.parent.mkdir(parents=True, exist_ok=True)
    path = stem.with_suffix(".svg")
    path.write_text(text)
    return Plot(text, caption, path)


def rows_by_cell(cells: pd.DataFrame) -> dict[tuple[str, str], Any]:
    """(mode, workload) -> that cell's row (a named tuple of the cells table)."""
    return {(str(r.mode), str(r.workload)): r for r in cells.itertuples()}


def _bottom_labels(c: svg.Canvas, names: list[str], x0: float, slot: float, y: float) -> float:
    """Workload names under their slots, slanted when they do not fit; returns their bottom."""
    widest = max(svg.text_width(n, 11) for n in names)
    slant = widest > slot - 6
    for i, name in enumerate(names):
        x = x0 + (i + 0.5) * slot
        if slant:
            c.text(x + 4, y + 12, name, anchor="end", rotate=-28)
        else:
            c.text(x, y + 16, name, anchor="middle")
    return y + (14 + widest * 0.47 if slant else 20)


def task_time_bars(
    t: HostTables, workloads: list[str], title: str, stem: Path | None
) -> Plot | None:
    """Bars of the median task time per workload and mode, each environment's value as a point."""
    cells = t.cells[t.cells["workload"].isin(workloads)]
    if cells.empty:
        return None
    all_modes = list(dict.fromkeys(t.cells["mode"]))  # host-wide order: same color everywhere
    modes = [m for m in all_modes if m in set(cells["mode"])]
    rows = [w for w in workloads if w in set(cells["workload"])]
    by_key = rows_by_cell(cells)
    complete = {k for k, r in by_key.items() if r.status == "complete"}
    points = {k: v for k, v in passed_values(t, "task_s", rows).items() if k in complete}
    values = [by_key[k].task_s_median for k in complete] + [
        float(v) for p in points.values() for v in p
    ]
    unit = unit_for(values)
    c = svg.Canvas(WIDTH, 0, f"{title}: host {t.host}, cohort {t.cohort}")
    c.text(LEFT, 18, c.title, size=13, bold=True)
    keys = [(m, svg.color(all_modes.index(m))) for m in modes] + [("one environment", "")]
    top = svg.legend(c, keys, LEFT, 38, WIDTH - 10) + 4
    scale = svg.value_scale([v * unit.per_second for v in values], top + PLOT_H, top)
    label = f"median environment task time ({unit.name}){', log' if scale.log else ''}"
    svg.axis_y(c, scale, LEFT, label, WIDTH - 10)
    slot = (WIDTH - 10 - LEFT) / len(rows)
    bar = Bar(scale, unit.per_second, min(slot * 0.8 / len(modes), MAX_BAR))
    for i, w in enumerate(rows):
        x0 = LEFT + (i + 0.5) * slot - bar.width * len(modes) / 2
        for j, m in enumerate(modes):
            x = x0 + j * bar.width
            bar.draw(c, x, by_key.get((m, w)), points.get((m, w)), all_modes.index(m))
    c.height = _bottom_labels(c, rows, LEFT, slot, scale.px_lo) + 8
    caption = (
        "Bars: median environment task time (sum of its rounds) over N environments; "
        f"points: each environment's own task time; {MISSING} (no bar, no points): "
        f"incomplete cell, hover for why; {UNIT_RULE}."
    )
    return save(c, caption, stem)


@dataclass(frozen=True)
class Bar:
    """How one cell's bar is drawn: value scale, seconds-to-unit factor, bar width."""

    scale: svg.Scale
    factor: float
    width: float

    def draw(self, c: svg.Canvas, x: float, row: Any, pts: np.ndarray | None, k: int) -> None:
        """Bar and points of a complete cell at ``x``; '—' for an incomplete one."""
        if row is None:  # not planned for this mode (e.g. a smoke preset's VM subset)
            return
        base, mid = self.scale.px_lo, x + self.width / 2
        if row.status != "complete":
            why = f"{row.mode} / {row.workload}: {row.reason}"
            c.text(mid, base - 4, MISSING, 14, "middle", MISSING_COLOR, tip=why, bold=True)
            return
        top = self.scale(row.task_s_median * self.factor)
        tip = f"{row.mode} / {row.workload}: median {row.task_s_median:.6g} s"
        c.rect(x, top, self.width - 1, base - top, svg.color(k), tip=tip)
        if pts is None:
            return
        xs, ys = mid + svg.spread(len(pts), self.width * 0.6), self.scale.many(pts * self.factor)
        c.dots(xs, ys, POINT_COLOR, 5.0 if len(pts) <= MANY_POINTS else 3.0, 0.65, ENV_CLASS)


def startup_range(t: HostTables, stem: Path | None) -> Plot | None:
    """Ready per mode: each passed environment as a point, min-max line, median tick (ms, log)."""
    s = t.startup
    if s.empty:
        return None
    env = t.environments
    ok = env[(env["status"] == "passed") & env["ready_ms"].notna()]
    ready = {str(m): g["ready_ms"].to_numpy(dtype=float) for m, g in ok.groupby("mode")}
    modes = [str(m) for m in s["mode"]]
    all_modes = list(dict.fromkeys(t.cells["mode"]))
    row_h, top = 26.0, 30.0
    left = max(LEFT, 16 + max(svg.text_width(m, 11) for m in modes))
    c = svg.Canvas(
        WIDTH,
        top + row_h * len(modes) + 48,
        f"Startup range (Ready): host {t.host}, cohort {t.cohort}",
    )
    c.text(LEFT, 18, c.title, size=13, bold=True)
    span = s[["ready_ms_min", "ready_ms_max"]].to_numpy(dtype=float).ravel()
    scale = svg.log_scale(list(span), left, WIDTH - 16)
    bottom = top + row_h * len(modes)
    label = "Ready (ms, log): points each passed environment, line min to max, bar the median"
    svg.axis_x(c, scale, bottom, label, top)
    lows, meds, highs = (
        s[col].to_numpy(dtype=float) for col in ("ready_ms_min", "ready_ms_median", "ready_ms_max")
    )
    for i, mode in enumerate(modes):
        y = top + row_h * (i + 0.5)
        c.text(left - 8, y + 4, mode, anchor="end")
        k = all_modes.index(mode) if mode in all_modes else i
        c.line(scale(lows[i]), y, scale(highs[i]), y, svg.color(k), 2)
        vals = ready.get(mode, np.array([]))
        ys = y + svg.spread(len(vals), row_h * 0.6)
        c.dots(
            scale.many(vals),
            ys,
            POINT_COLOR,
            4.0 if len(vals) <= MANY_POINTS else 2.5,
            0.5,
            ENV_CLASS,
        )
        c.rect(scale(meds[i]) - 1.5, y - 9, 3, 18, "#000", tip=f"{mode}: median {meds[i]:.4g} ms")
    caption = (
        "Ready in ms from the marker to the payload's ready line, over passed "
        "environments: each point one environment, line min to max, bar the median."
    )
    return save(c, caption, stem)


def relative_heatmap(t: HostTables, workloads: list[str], stem: Path | None) -> Plot | None:
    """Median task time relative to the fastest complete mode of each workload (1.00x)."""
    cells = t.cells[t.cells["workload"].isin(workloads)]
    if cells.empty:
        return None
    # pivot, not pivot_table: a cell twice must raise, never be averaged away
    table: pd.DataFrame = cells.pivot(index="workload", columns="mode", values="task_s_median")  # noqa: PD010
    rows = [w for w in workloads if w in table.index]
    modes = list(dict.fromkeys(cells["mode"]))
    ratio = table.reindex(index=rows, columns=modes)
    ratio = ratio.div(ratio.min(axis=1), axis=0)
    by_key = rows_by_cell(cells)
    values = ratio.to_numpy(dtype=float)
    left = 16 + max(svg.text_width(w, 11) for w in rows)
    col = min(110.0, (WIDTH - 10 - left) / len(modes))
    row_h, top = 22.0, 48.0
    c = svg.Canvas(
        WIDTH,
        top + row_h * len(rows) + 10,
        f"Task time / fastest complete mode: host {t.host}, cohort {t.cohort}",
    )
    c.text(LEFT, 18, c.title, size=13, bold=True)
    worst = float(np.nanmax(values)) if np.isfinite(values).any() else 1.0
    for j, m in enumerate(modes):
        c.text(left + (j + 0.5) * col, top - 8, m, anchor="middle")
    for i, w in enumerate(rows):
        y = top + i * row_h
        c.text(left - 8, y + row_h / 2 + 4, w, anchor="end")
        for j, m in enumerate(modes):
            cell = (left + j * col, y, col, row_h)
            _heat_cell(c, by_key.get((m, w)), values[i, j], worst, cell)
    caption = (
        "Median task time of each mode divided by the fastest complete mode of the same "
        f"workload (1.00x = fastest; darker = closer to it); {MISSING}: incomplete cell."
    )
    return save(c, caption, stem)


def _heat_cell(
    c: svg.Canvas, row: Any, r: float, worst: float, box: tuple[float, float, float, float]
) -> None:
    """One heatmap cell: colored ratio, or '—' on grey when the cell is incomplete."""
    x, y, w, h = box
    if row is None:
        return
    if np.isnan(r):
        why = f"{row.mode} / {row.workload}: {row.reason}"
        c.rect(x + 1, y + 1, w - 2, h - 2, "#eee", tip=why)
        c.text(x + w / 2, y + h / 2 + 5, MISSING, size=13, anchor="middle", fill=MISSING_COLOR)
        return
    t = np.log(r) / np.log(worst) if worst > 1 else 0.0
    c.rect(x + 1, y + 1, w - 2, h - 2, svg.ramp(float(t)), tip=f"{r:.3f}x")
    label = f"{r:.2f}x" if r < 10 else f"{r:.1f}x" if r < 100 else f"{r:.0f}x"
    c.text(
        x + w / 2,
        y + h / 2 + 4,
        label,
        size=10,
        anchor="middle",
        fill="#fff" if t < 0.6 else "#111",
    )


VERDICT_COLORS = {
    "faster": "#2a7d2e",
    "slower": "#b3261e",
    "no significant difference": "#555",
    "exploratory": "#999",
    "withheld": "#c77700",
}


def ratio_plot(
    rows: list[tuple[str, float, float | None, float | None, str]],
    title: str,
    stem: Path | None = None,
) -> Plot | None:
    """Ratio B / A per cell (label, ratio, low, high, verdict) on a log axis, 1 marked."""
    if not rows:
        return None
    left = 16 + max(svg.text_width(r[0], 11) for r in rows)
    row_h, top = 22.0, 30.0
    bottom = top + row_h * len(rows)
    c = svg.Canvas(WIDTH, bottom + 48, title)
    c.text(LEFT, 18, title, size=13, bold=True)
    span = [v for r in rows for v in (r[1], r[2], r[3]) if v is not None] + [1.0]
    scale = svg.log_scale(span, left, WIDTH - 16)
    svg.axis_x(c, scale, bottom, "ratio B / A (log): below 1, B is faster", top)
    c.line(scale(1.0), top, scale(1.0), bottom, "#000", 1, dash="4 3")
    for i, (label, ratio, low, high, word) in enumerate(rows):
        y = top + row_h * (i + 0.5)
        fill = VERDICT_COLORS.get(word, "#555")
        c.text(left - 8, y + 4, label, anchor="end")
        if low is not None and high is not None:
            c.line(scale(low), y, scale(high), y, fill, 2)
        c.dots([scale(ratio)], [y], fill, 8.0, 1.0)
        c.text(WIDTH - 16, y - 5, word, size=9, anchor="end", fill=fill)
    caption = (
        "Ratio of medians B / A per cell: point the ratio, line the exact 95% rank-based "
        "(Hodges-Lehmann) interval of the ratio "
        "(both sides N >= 10; none when exploratory), dashed line 1 (no change)."
    )
    return save(c, caption, stem)


def sentinel_drift(s: SentinelTable, stem: Path | None) -> Plot | None:
    """Each sentinel point's task time relative to its calibration's median, over the campaign."""
    ok = s.points[(s.points["status"] == "passed") & s.points["task_s"].notna()]
    if ok.empty:
        return None
    medians = s.medians()
    minutes = float(ok["at_s"].max()) > 2 * 60
    per = 60.0 if minutes else 1.0
    c = svg.Canvas(WIDTH, 0, f"Machine-state sentinel over the campaign: host {s.host}, "
                   f"cohort {s.cohort}")  # fmt: skip
    c.text(LEFT, 18, c.title, size=13, bold=True)
    names = list(medians)
    keys = [(f"{w} (median {duration(medians[w][1])})", svg.color(i)) for i, w in enumerate(names)]
    top = svg.legend(c, keys, LEFT, 38, WIDTH - 10) + 4
    rel = {w: ok.loc[ok["workload"] == w, "task_s"].to_numpy(dtype=float) / m for w, (_, m)
           in medians.items()}  # fmt: skip
    y = svg.value_scale([float(v) for r in rel.values() for v in r] + [1.0], top + PLOT_H, top)
    svg.axis_y(c, y, LEFT, "task time / its median", WIDTH - 10)
    span = float(ok["at_s"].max()) / per or 1.0
    x = svg.Scale(0.0, span * 1.02, LEFT, WIDTH - 16)
    unit = "min" if minutes else "s"
    svg.axis_x(c, x, top + PLOT_H, f"time into the campaign ({unit}): host wall time of the "
               "environments run before the point", top)  # fmt: skip
    c.line(LEFT, y(1.0), WIDTH - 16, y(1.0), "#000", 1, dash="4 3")
    for i, w in enumerate(names):
        g = ok[ok["workload"] == w]
        xs, ys = x.many(g["at_s"].to_numpy(dtype=float) / per), y.many(rel[w])
        for j in range(1, len(xs)):
            c.line(xs[j - 1], ys[j - 1], xs[j], ys[j], svg.color(i), 1.5)
        c.dots(xs, ys, svg.color(i), 6.0, 0.9, ENV_CLASS)
    c.height = top + PLOT_H + 48
    caption = (
        "Each point one calibration environment of the sentinel (native, fixed work) at the "
        "start, every K environments and at the end, its task time divided by the median of its "
        "kind in this campaign (dashed: 1). A level line is a steady machine; a slope or a step "
        "is the machine's own drift, which the seeded order spread over every mode."
    )
    return save(c, caption, stem)
