"""Where a campaign's wall time went: measured, preparation, checks, cleanup, the harness's rest.

Each record's ``phases`` (from the runner) split its environment's time into preparation
(workspace copy, cgroup, container or guest), the drive (marker to exit), the oracle and
cleanup. The measured part of the drive is Ready plus the round times; the rest of the drive
(each round's check, the exit) and the oracle are "oracle and checks". Whatever the campaign's
wall time holds beyond the environments' phases is the harness itself (the gate, signing,
storing, progress): its share is the figure to keep small (target at most 3%). Preparation
done ahead (``worker.ahead``) ran beside the environment before it: the seconds of it that
overlapped (a record's ``overlapped_s``) are not counted twice, and the line says how many.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from contract.records import EnvironmentRecord

HARNESS_TARGET = 0.03  # the harness's own rest, as a share of the campaign's wall time
PARTS = ("measured", "preparation", "oracle and checks", "cleanup", "sentinel")
LARGEST = 5  # unmeasured costs ``sandbench run`` names, largest first
COST_ROWS = 12  # mode/workload rows of the report's cost table, most unmeasured first


@dataclass
class WallSplit:
    """Seconds of one run's wall time per part (``PARTS``) and the wall time itself."""

    wall_s: float = 0.0
    measured: float = 0.0
    preparation: float = 0.0
    checks: float = 0.0
    cleanup: float = 0.0
    sentinel: float = 0.0  # the calibration environments, whole
    overlapped: float = 0.0  # preparation hidden beside the environment before it
    # seconds of each step outside the clocks (the record's ``steps``) per mode and workload
    steps: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def add(self, record: EnvironmentRecord) -> None:
        """Count one environment's phases (a record without them, e.g. not run, adds nothing)."""
        extra = record.model_extra or {}
        phases = extra.get("phases") or {}
        if not phases:
            return
        overlapped = float(extra.get("overlapped_s") or 0.0)
        self.overlapped += overlapped
        if record.kind == "sentinel":
            self.sentinel += sum(phases.values()) - overlapped
            return
        measured = (record.ready_ms or 0.0) / 1000 + sum(r.task_s for r in record.rounds)
        self.measured += measured
        self.preparation += phases.get("prepare_s", 0.0) - overlapped
        self.checks += phases.get("drive_s", 0.0) - measured + phases.get("oracle_s", 0.0)
        self.cleanup += phases.get("cleanup_s", 0.0)
        for step, seconds in (extra.get("steps") or {}).items():
            self.steps[record.mode, record.workload, step.removesuffix("_s")] += seconds

    def lines(self) -> list[str]:
        """What ``sandbench run`` prints at its end: the split, then the largest costs."""
        lines, largest = [self.line()], self.largest()
        if largest:
            lines.append("largest unmeasured costs: " + "; ".join(largest))
        return lines

    def largest(self, n: int = LARGEST) -> list[str]:
        """The ``n`` largest unmeasured costs by mode, workload and step, with their share."""
        wall = self.wall_s or 1.0
        return [
            f"{mode} / {workload} {step}: {s:.1f} s ({100 * s / wall:.1f}%)"
            for (mode, workload, step), s in self.steps.most_common(n)
        ]

    @property
    def rest(self) -> float:
        """The harness's own seconds: the wall time no environment phase accounts for."""
        parts = self.measured + self.preparation + self.checks + self.cleanup + self.sentinel
        return max(0.0, self.wall_s - parts)

    def line(self) -> str:
        """One line for the end of ``sandbench run``: every part in seconds and percent."""
        wall = self.wall_s or 1.0
        values = (self.measured, self.preparation, self.checks, self.cleanup, self.sentinel)
        parts = ", ".join(
            f"{name} {s:.1f} s ({100 * s / wall:.1f}%)"
            for name, s in zip(PARTS, values, strict=True)
        )
        share = self.rest / wall
        verdict = "within" if share <= HARNESS_TARGET else "ABOVE"
        hidden = (
            f"; preparation done ahead, beside the environment before: {self.overlapped:.2f} s"
            if self.overlapped
            else ""
        )
        return (
            f"wall time {self.wall_s:.1f} s: {parts}{hidden}; harness {self.rest:.1f} s "
            f"({100 * share:.1f}%, {verdict} the {100 * HARNESS_TARGET:.0f}% target)"
        )


def cost_rows(env: pd.DataFrame, limit: int = COST_ROWS) -> list[list[str]]:
    """Per mode and workload of one host's environments (``HostTables.environments``): how many
    ran, seconds measured (Ready and rounds), of preparation, checks and oracle, and cleanup,
    and the unmeasured share; the ``limit`` rows with the most unmeasured seconds, then all."""
    ran = env[env["prepare_s"].notna()]
    if ran.empty:
        return []
    measured = ran["ready_ms"].fillna(0.0) / 1000 + ran["task_s"].fillna(0.0)
    parts = pd.DataFrame({
        "mode": ran["mode"], "workload": ran["workload"], "n": 1, "measured": measured,
        "preparation": ran["prepare_s"], "checks": ran["drive_s"] - measured + ran["oracle_s"],
        "cleanup": ran["cleanup_s"],
    })  # fmt: skip
    sums = parts.groupby(["mode", "workload"], sort=False).sum(numeric_only=True)
    sums["unmeasured"] = sums["preparation"] + sums["checks"] + sums["cleanup"]
    top = sums.sort_values("unmeasured", ascending=False, kind="stable").head(limit)
    total = sums.sum(numeric_only=True)

    def row(name: str, r: pd.Series) -> list[str]:
        whole = r["measured"] + r["unmeasured"]
        share = f"{100 * r['unmeasured'] / whole:.0f}%" if whole > 0 else "-"
        seconds = [f"{r[c]:.1f}" for c in ("measured", "preparation", "checks", "cleanup")]
        return [name, str(int(r["n"])), *seconds, share]

    names = [f"{mode} / {workload}" for mode, workload in top.index.to_list()]
    rows = [row(name, r) for name, (_, r) in zip(names, top.iterrows(), strict=True)]
    return [*rows, row(f"all {len(sums)} cells", total)]
