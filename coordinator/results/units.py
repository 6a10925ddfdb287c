"""Numbers as the report shows them: significant digits, '—' when missing, ms below one second.

The unit rule (tables, plots and ``compare`` alike): a group of durations is shown in
milliseconds when every value of the group is below one second, else in seconds. The group is
one row of a table (so a row's median, interval and P95 share a unit) or one axis of a plot; a
value shown alone (a headline) is its own group. Raw files (results.csv, JSON) stay in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

MISSING = "—"
UNIT_RULE = (
    "durations in ms when every value of the row (of the axis, in plots) is below 1 s, else in s"
)


def fmt(value: Any, digits: int = 4) -> str:
    """A number with ``digits`` significant digits, '—' for a missing one."""
    if value is None or math.isnan(float(value)):
        return MISSING
    v = float(value)
    return f"{v:.0f}" if abs(v) >= 10 ** (digits - 1) else f"{v:.{digits}g}"


@dataclass(frozen=True)
class Unit:
    """A display unit of durations given in seconds."""

    name: str
    per_second: float

    def show(self, seconds: Any, digits: int = 4) -> str:
        """``seconds`` in this unit, without the unit's name; '—' when missing."""
        if seconds is None or math.isnan(float(seconds)):
            return MISSING
        return fmt(float(seconds) * self.per_second, digits)


SECONDS = Unit("s", 1.0)
MILLISECONDS = Unit("ms", 1000.0)


def unit_for(seconds: Iterable[Any]) -> Unit:
    """Milliseconds when every present value is below one second, else seconds."""
    present = [abs(float(v)) for v in seconds if v is not None and not math.isnan(float(v))]
    return MILLISECONDS if present and max(present) < 1.0 else SECONDS


def duration(seconds: Any) -> str:
    """One duration with its own unit, e.g. '412.3 ms' or '2.5 s'; '—' when missing."""
    unit = unit_for([seconds])
    text = unit.show(seconds)
    return text if text == MISSING else f"{text} {unit.name}"
