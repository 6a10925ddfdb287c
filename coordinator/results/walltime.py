"""Where a campaign's wall time went: measured, preparation, checks, cleanup, the harness's rest.

Each record's ``phases`` (from the runner) split its environment's time into preparation
(workspace copy, cgroup, container or guest), the drive (marker to exit), the oracle and
cleanup. The measured part of the drive is Ready plus the round times; the rest of the drive
(each round's check, the exit) and the oracle are "oracle and checks". Whatever the campaign's
wall time holds beyond the environments' phases is the harness itself (the gate, signing,
storing, progress): its share is the figure to keep small (target at most 3%).
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.records import EnvironmentRecord

HARNESS_TARGET = 0.03  # the harness's own rest, as a share of the campaign's wall time
PARTS = ("measured", "preparation", "oracle and checks", "cleanup", "sentinel")


@dataclass
class WallSplit:
    """Seconds of one run's wall time per part (``PARTS``) and the wall time itself."""

    wall_s: float = 0.0
    measured: float = 0.0
    preparation: float = 0.0
    checks: float = 0.0
    cleanup: float = 0.0
    sentinel: float = 0.0  # the calibration environments, whole

    def add(self, record: EnvironmentRecord) -> None:
        """Count one environment's phases (a record without them, e.g. not run, adds nothing)."""
        phases = (record.model_extra or {}).get("phases") or {}
        if not phases:
            return
        if record.kind == "sentinel":
            self.sentinel += sum(phases.values())
            return
        measured = (record.ready_ms or 0.0) / 1000 + sum(r.task_s for r in record.rounds)
        self.measured += measured
        self.preparation += phases.get("prepare_s", 0.0)
        self.checks += phases.get("drive_s", 0.0) - measured + phases.get("oracle_s", 0.0)
        self.cleanup += phases.get("cleanup_s", 0.0)

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
        return (
            f"wall time {self.wall_s:.1f} s: {parts}; harness {self.rest:.1f} s "
            f"({100 * share:.1f}%, {verdict} the {100 * HARNESS_TARGET:.0f}% target)"
        )
