"""Plots of one host's tables (matplotlib, Agg): SVG for the HTML report, PNG beside it."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen before pyplot loads)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from coordinator.analysis import HostTables  # noqa: E402

FIG_WIDTH_IN = 9.0
BAR_WIDTH = 0.8
# Text stays text in SVG (smaller, faster, searchable); the browser supplies the font.
plt.rcParams.update({"svg.hashsalt": "sandbench", "svg.fonttype": "none", "font.size": 9})
PNG_DPI = 90
LOG_SPREAD = 20.0  # values spanning more than this factor get a log axis


def _save(fig: Figure, stem: Path) -> tuple[Path, Path]:
    """Write ``stem``.svg and ``stem``.png; returns both paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    svg, png = stem.with_suffix(".svg"), stem.with_suffix(".png")
    fig.savefig(svg, metadata={"Date": None})
    fig.savefig(png, dpi=PNG_DPI)
    plt.close(fig)
    return svg, png


def _spread(values: np.ndarray) -> float:
    """Ratio of the largest to the smallest finite value (1 when there are none)."""
    finite = values[np.isfinite(values) & (values > 0)]
    return float(finite.max() / finite.min()) if finite.size else 1.0


def task_time_bars(
    t: HostTables, workloads: list[str], title: str, stem: Path
) -> tuple[Path, Path] | None:
    """Grouped bars: median environment task time per workload (groups) and mode (bars)."""
    cells = t.cells[t.cells["workload"].isin(workloads)]
    if cells.empty:
        return None
    table = cells.pivot(index="workload", columns="mode", values="task_s_median")
    table = table.reindex(index=[w for w in workloads if w in table.index],
                          columns=list(dict.fromkeys(cells["mode"])))  # fmt: skip
    planned = set(zip(cells["mode"], cells["workload"], strict=True))
    fig, ax = plt.subplots(figsize=(FIG_WIDTH_IN, 3.2 + 0.1 * len(table.columns)))
    x = np.arange(len(table.index))
    width = BAR_WIDTH / max(len(table.columns), 1)
    values_all = table.to_numpy(dtype=float)
    log = _spread(values_all) > LOG_SPREAD
    floor = np.nanmin(values_all) / 2 if log else 0.0
    for i, mode in enumerate(table.columns):
        values = table[mode].to_numpy(dtype=float)
        pos = x + i * width - BAR_WIDTH / 2 + width / 2
        ax.bar(pos, np.nan_to_num(values, nan=floor) - floor, width, bottom=floor, label=mode)
        for xi, w, v in zip(pos, table.index, values, strict=True):
            if np.isnan(v) and (mode, w) in planned:  # incomplete: mark it, never draw a zero
                ax.text(xi, floor, "—", ha="center", va="bottom")
    ax.set_xticks(x, table.index, rotation=20, ha="right")
    if log:
        ax.set_yscale("log")
    ax.set_ylabel("median environment task time (s)" + (", log scale" if log else ""))
    ax.set_title(f"{title} — host {t.host}, cohort {t.cohort} ('—' = incomplete)")
    ax.legend(fontsize=7, ncols=min(len(table.columns), 5))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.2, top=0.9)
    return _save(fig, stem)


def startup_range(t: HostTables, stem: Path) -> tuple[Path, Path] | None:
    """Ready per mode: median with a min-max range (ms, log scale)."""
    s = t.startup
    if s.empty:
        return None
    fig, ax = plt.subplots(figsize=(FIG_WIDTH_IN, 2.8))
    y = np.arange(len(s))
    med = s["ready_ms_median"].to_numpy(dtype=float)
    lo, hi = (
        med - s["ready_ms_min"].to_numpy(dtype=float),
        s["ready_ms_max"].to_numpy(dtype=float) - med,
    )
    ax.errorbar(med, y, xerr=[lo, hi], fmt="o", capsize=4)
    ax.set_yticks(y, s["mode"])
    ax.set_xscale("log")
    ax.set_xlabel("Ready (ms): min / median / max over passed environments")
    ax.set_title(f"Startup range — host {t.host}, cohort {t.cohort}")
    fig.subplots_adjust(left=0.14, right=0.98, bottom=0.18, top=0.88)
    return _save(fig, stem)


def relative_heatmap(t: HostTables, workloads: list[str], stem: Path) -> tuple[Path, Path] | None:
    """Median task time relative to the fastest complete mode of each workload (1.0 = fastest)."""
    cells = t.cells[t.cells["workload"].isin(workloads)]
    if cells.empty:
        return None
    table: pd.DataFrame = cells.pivot(index="workload", columns="mode", values="task_s_median")
    table = table.reindex(index=[w for w in workloads if w in table.index],
                          columns=list(dict.fromkeys(cells["mode"])))  # fmt: skip
    ratio = table.div(table.min(axis=1), axis=0)
    fig, ax = plt.subplots(figsize=(FIG_WIDTH_IN, 1.0 + 0.32 * len(ratio.index)))
    im = ax.imshow(np.log10(ratio.to_numpy(dtype=float)), aspect="auto", cmap="viridis")
    planned = set(zip(cells["mode"], cells["workload"], strict=True))
    for (i, j), v in np.ndenumerate(ratio.to_numpy(dtype=float)):
        if np.isnan(v) and (ratio.columns[j], ratio.index[i]) in planned:
            ax.text(j, i, "—", ha="center", va="center", fontsize=8)  # incomplete, not fast
    ax.set_xticks(range(len(ratio.columns)), ratio.columns)
    ax.set_yticks(range(len(ratio.index)), ratio.index)
    ax.set_title(f"Task time / fastest complete mode (log10) — host {t.host}, cohort {t.cohort}")
    fig.colorbar(im, ax=ax, label="log10 ratio")
    fig.subplots_adjust(left=0.14, right=0.98, bottom=0.12, top=0.92)
    return _save(fig, stem)
