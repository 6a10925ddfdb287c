"""SVG drawing written directly (no plotting library): a canvas, value scales with ticks, colors.

A figure is a few hundred elements, so writing SVG text is fast (about a millisecond per figure)
and the page that embeds it stays self-contained. Text stays text: the browser supplies the font.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from coordinator.results.units import fmt

FONT = "system-ui,'DejaVu Sans',sans-serif"
# Tableau 10: one color per mode, in the plan's mode order.
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
# Viridis at ten stops, dark (low) to light (high).
VIRIDIS = (
    "#440154",
    "#482878",
    "#3e4989",
    "#31688e",
    "#26828e",
    "#1f9e89",
    "#35b779",
    "#6ece58",
    "#b5de2b",
    "#fde725",
)
GLYPH_EM = 0.58  # average glyph width per font size, to lay out labels without a font engine
LOG_SPREAD = 20.0  # values spanning more than this factor get a log axis


def num(v: float) -> str:
    """A coordinate with one decimal, no trailing '.0'."""
    text = f"{v:.1f}"
    return text.removesuffix(".0")


def text_width(text: str, size: float) -> float:
    """Estimated width in pixels of ``text`` at font ``size``."""
    return len(text) * size * GLYPH_EM


def color(i: int) -> str:
    """The ``i``-th palette color (cycles)."""
    return PALETTE[i % len(PALETTE)]


def ramp(t: float) -> str:
    """Viridis color at ``t`` in [0, 1]."""
    t = min(max(t, 0.0), 1.0)
    return VIRIDIS[round(t * (len(VIRIDIS) - 1))]


@dataclass
class Canvas:
    """An SVG picture of ``width`` x ``height`` pixels built element by element."""

    width: float
    height: float
    title: str
    parts: list[str] = field(default_factory=list)

    def line(
        self,
        x1: float,
        y1: float,
        x2: float,
        y2: float,
        stroke: str = "#444",
        width: float = 1.0,
        dash: str | None = None,
    ) -> None:
        """A straight line."""
        extra = f" stroke-dasharray='{dash}'" if dash else ""
        self.parts.append(
            f"<line x1='{num(x1)}' y1='{num(y1)}' x2='{num(x2)}' y2='{num(y2)}' "
            f"stroke='{stroke}' stroke-width='{width}'{extra}/>"
        )

    def rect(self, x: float, y: float, w: float, h: float, fill: str, tip: str = "") -> None:
        """A filled rectangle; ``tip`` shows on hover."""
        body = f"<title>{html.escape(tip)}</title></rect>" if tip else "/>"
        self.parts.append(
            f"<rect x='{num(x)}' y='{num(y)}' width='{num(max(w, 0))}' "
            f"height='{num(max(h, 0))}' fill='{fill}'{'>' if tip else ''}{body}"
        )

    def text(
        self,
        x: float,
        y: float,
        s: str,
        size: float = 11,
        anchor: str = "start",
        fill: str = "#222",
        rotate: float = 0,
        tip: str = "",
        bold: bool = False,
    ) -> None:
        """A label; ``anchor`` is start, middle or end; ``rotate`` in degrees about (x, y)."""
        attrs = f"x='{num(x)}' y='{num(y)}' font-size='{size}' text-anchor='{anchor}' fill='{fill}'"
        attrs += f" transform='rotate({num(rotate)} {num(x)} {num(y)})'" if rotate else ""
        attrs += " font-weight='bold'" if bold else ""
        inner = html.escape(s) + (f"<title>{html.escape(tip)}</title>" if tip else "")
        self.parts.append(f"<text {attrs}>{inner}</text>")

    def dots(
        self,
        xs: Sequence[float] | np.ndarray,
        ys: Sequence[float] | np.ndarray,
        fill: str,
        size: float = 4.0,
        opacity: float = 0.8,
        cls: str = "",
    ) -> None:
        """Round dots of diameter ``size`` at (xs, ys): one path of zero-length round strokes."""
        if len(xs) == 0:
            return
        xy = np.round(np.column_stack([xs, ys]), 1).tolist()  # one decimal, as ``num`` writes
        d = "".join(f"M{x:g} {y:g}h0" for x, y in xy)
        attr = f" class='{cls}'" if cls else ""
        self.parts.append(
            f"<path{attr} d='{d}' stroke='{fill}' stroke-width='{size}' "
            f"stroke-linecap='round' stroke-opacity='{opacity}' fill='none'/>"
        )

    def to_svg(self) -> str:
        """The picture as one standalone ``<svg>`` element."""
        head = (
            f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {num(self.width)} "
            f"{num(self.height)}' width='{num(self.width)}' height='{num(self.height)}' "
            f"font-family=\"{FONT}\" role='img'><title>{html.escape(self.title)}</title>"
            f"<rect width='100%' height='100%' fill='#fff'/>"
        )
        return head + "".join(self.parts) + "</svg>\n"


@dataclass(frozen=True)
class Scale:
    """Maps values in [lo, hi] to pixels in [px_lo, px_hi], linearly or logarithmically."""

    lo: float
    hi: float
    px_lo: float
    px_hi: float
    log: bool = False

    def __call__(self, v: float) -> float:
        """Pixel position of ``v`` (clamped to the domain)."""
        return float(self.many(np.array([v], dtype=float))[0])

    def many(self, values: np.ndarray) -> np.ndarray:
        """Pixel positions of ``values`` (clamped to the domain), vectorized."""
        v = np.clip(np.asarray(values, dtype=float), self.lo, self.hi)
        if self.log:
            t = np.log10(v / self.lo) / math.log10(self.hi / self.lo)
        else:
            t = (v - self.lo) / (self.hi - self.lo)
        out: np.ndarray = self.px_lo + t * (self.px_hi - self.px_lo)
        return out

    def ticks(self) -> list[float]:
        """Tick values: 1-2-5 steps (linear) or decades, with 2 and 5 when few (log)."""
        if not self.log:
            step = nice_step(self.hi - self.lo)
            return [i * step for i in range(int(self.hi / step + 1e-9) + 1) if i * step >= self.lo]
        first, last = round(math.log10(self.lo)), round(math.log10(self.hi))
        mults = (1, 2, 5) if last - first <= 2 else (1,)
        out = [m * 10.0**e for e in range(first, last + 1) for m in mults]
        return [v for v in out if self.lo * (1 - 1e-9) <= v <= self.hi * (1 + 1e-9)]

    def labels(self) -> list[tuple[float, str]]:
        """(value, label) of every tick."""
        return [(v, fmt(v, 3)) for v in self.ticks()]


def nice_step(span: float, target: int = 5) -> float:
    """A 1, 2 or 5 times a power of ten step that cuts ``span`` into about ``target`` parts."""
    raw = span / target if span > 0 else 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def value_scale(values: Sequence[float], px_lo: float, px_hi: float) -> Scale:
    """A scale covering ``values`` (positive): from zero, or log when they span > LOG_SPREAD."""
    finite = [v for v in values if v > 0 and math.isfinite(v)] or [1.0]
    lo, hi = min(finite), max(finite)
    if hi / lo > LOG_SPREAD:
        return Scale(
            10.0 ** math.floor(math.log10(lo)),
            10.0 ** math.ceil(math.log10(hi)),
            px_lo,
            px_hi,
            log=True,
        )
    step = nice_step(hi)
    return Scale(0.0, math.ceil(hi * 1.02 / step) * step, px_lo, px_hi)


def log_scale(values: Sequence[float], px_lo: float, px_hi: float) -> Scale:
    """A log scale over whole decades covering the positive ``values``."""
    finite = [v for v in values if v > 0 and math.isfinite(v)] or [1.0]
    lo = 10.0 ** math.floor(math.log10(min(finite)))
    hi = 10.0 ** math.ceil(math.log10(max(finite)))
    return Scale(lo, hi if hi > lo else lo * 10, px_lo, px_hi, log=True)


def axis_y(c: Canvas, s: Scale, x: float, label: str, grid_to: float) -> None:
    """Left value axis at ``x`` with ticks, labels, light grid lines to ``grid_to`` and a title."""
    for v, text in s.labels():
        y = s(v)
        c.line(x, y, grid_to, y, stroke="#e4e4e4")
        c.line(x - 4, y, x, y)
        c.text(x - 6, y + 4, text, size=10, anchor="end")
    c.line(x, s.px_lo, x, s.px_hi)
    mid = (s.px_lo + s.px_hi) / 2
    c.text(14, mid, label, size=11, anchor="middle", rotate=-90)


def axis_x(c: Canvas, s: Scale, y: float, label: str, grid_to: float) -> None:
    """Bottom value axis at ``y`` with ticks, labels, light grid lines up to ``grid_to``."""
    for v, text in s.labels():
        x = s(v)
        c.line(x, grid_to, x, y, stroke="#e4e4e4")
        c.line(x, y, x, y + 4)
        c.text(x, y + 16, text, size=10, anchor="middle")
    c.line(s.px_lo, y, s.px_hi, y)
    c.text((s.px_lo + s.px_hi) / 2, y + 32, label, size=11, anchor="middle")


def legend(c: Canvas, keys: Sequence[tuple[str, str]], x: float, y: float, right: float) -> float:
    """Keys (label, color or "" for a dot) from (x, y), wrapping at ``right``; returns y below."""
    cx = x
    for name, fill in keys:
        w = 16 + text_width(name, 11) + 14
        if cx + w > right and cx > x:
            cx, y = x, y + 16
        if fill:
            c.rect(cx, y - 9, 10, 10, fill)
        else:
            c.dots([cx + 5], [y - 4], "#111", 4.0)
        c.text(cx + 14, y, name, size=11)
        cx += w
    return y + 16


def spread(n: int, width: float) -> np.ndarray:
    """Offsets of ``n`` points across ``width`` (golden-ratio sequence: even, no RNG)."""
    if n <= 1:
        return np.zeros(n)
    out: np.ndarray = ((np.arange(n) * 0.6180339887) % 1.0 - 0.5) * width
    return out
