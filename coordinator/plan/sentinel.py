"""The machine-state sentinel: fixed calibration environments run through every campaign.

Within a campaign the seeded order spreads the machine's own drift (a busy neighbour, a warm
or cold disk) over every mode; between two campaigns nothing does, so a slower machine would
pass for a slower mode. Each campaign therefore runs, on each host, a *point* of calibration
environments (``workloads.calibration``, one per resource a workload's time depends on:
``sentinel-cpu``, an interpreted integer loop; ``sentinel-fsync``, 4 KiB appends each fsynced;
``sentinel-meta``, small files created in new directories; ``sentinel-read``, a file read from
the page cache; native mode, fixed work, each well under a second) at the start, after every K
environments of the seeded order, and at the end.

Sentinel environments are planned, run through the same gate, signed and stored like every
other (``kind = "sentinel"`` on spec and record), and ``verify`` counts them for completeness;
they belong to no cell: the first-failure rule ignores them, and the result tables, results.csv
and the coverage counts of the workloads never include them. The report plots them over the
campaign's time and states their share of the environments' wall time; ``compare`` prints the
ratio of their medians between two campaigns and withholds a faster/slower verdict when the
machine's own shift, in a resource the cell's workload uses (``bearing_on``), is as large as the
effect (see ``drift_masks``): a metadata drift withholds the metadata workloads' verdicts, not
those of a workload that only writes and fsyncs.

Plan option (``coordinator.plan.file``): ``sentinel = false`` turns it off; ``[sentinel]`` with
``every = K`` sets K (default ``DEFAULT_EVERY``).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from contract.records import EnvironmentSpec
from workloads.catalog import CALIBRATION, DECLARED

KIND = "sentinel"
MODE = "native"
WORKLOADS = tuple(CALIBRATION)  # one point runs each of them, in this order
ROUNDS = 3
SCALE = 1.0  # their parameters never scale anyway
SEED = 0  # the same bytes in every campaign
LIMIT_S = 30.0  # at most the plan's limit
# Environments between two points: the smoke preset (474 environments) then gets 7 points of
# four environments of 0.1-0.3 s each: 1.12% of its environments' wall time here (README,
# 2026-12-02). With two calibrations a point, K = 40 gave 1.33% and K = 30 1.48-1.89%: four at
# K = 40 would be near the 2% budget.
DEFAULT_EVERY = 80
MAX_EVERY = 50_000  # the largest expansion per host (coordinator.plan.file.MAX_PLANNED)
# compare withholds faster/slower when the sentinel moved the same way as the cell and at least
# this fraction of the cell's own move, both as |log ratio| (0.5: half the effect, or more,
# could be the machine's).
MASK_FRACTION = 0.5


class SentinelPlan(BaseModel):
    """The plan's ``[sentinel]`` table; ``sentinel = false`` is ``every = 0`` (off)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    every: int = Field(DEFAULT_EVERY, ge=0, le=MAX_EVERY)  # K; 0 turns the sentinel off

    @classmethod
    def of(cls, value: Any) -> Any:
        """``true``/``false`` as the table they mean; anything else as given (validated after)."""
        if value is True:
            return {}
        if value is False:
            return {"every": 0}
        if not isinstance(value, dict | SentinelPlan):
            raise ValueError(
                "write sentinel = true, sentinel = false, or a table such as "
                f"[sentinel] every = {DEFAULT_EVERY}"
            )
        return value


Slot = int | tuple[int, str]  # a cell environment's index, or (point, calibration workload)


def layout(n: int, every: int) -> Iterator[Slot]:
    """A host's run order: its ``n`` environments (indices) with the sentinel's points inserted
    at the start, after every ``every`` environments and at the end (never twice in a row)."""
    point = 0
    for i in range(n + 1):
        if every and (i % every == 0 or i == n):
            yield from ((point, w) for w in WORKLOADS)
            point += 1
        if i < n:
            yield i


def points(n: int, every: int) -> int:
    """How many points ``layout(n, every)`` holds."""
    return n // every + 1 + (1 if n % every else 0) if every else 0


def spec(
    base: dict[str, Any], point: int, workload: str, order: int, limit_s: float
) -> EnvironmentSpec:
    """The calibration environment ``workload`` of sentinel point ``point`` at ``order``.

    ``base`` carries what every environment of the host shares (campaign, cohort, host, quota,
    VM size, work root); the rest is fixed, so two campaigns' sentinels do the same work.
    """
    return EnvironmentSpec(
        **base, mode=MODE, workload=workload, env_index=point, attempt=1, order_index=order,
        task_id=uuid.uuid4().hex, seed=SEED, scale=SCALE, rounds=ROUNDS,
        limit_s=min(LIMIT_S, limit_s), mode_options={}, kind=KIND,
    )  # fmt: skip


def drift_masks(drift: float, ratio: float) -> bool:
    """Whether the machine's shift ``drift`` (B / A) could be the cell's ``ratio``: the same
    direction and at least ``MASK_FRACTION`` of it in log terms. A machine that moved the other
    way only makes the cell's effect look smaller than it is, so it masks nothing."""
    if drift <= 0 or ratio <= 0:
        return False
    d, r = math.log(drift), math.log(ratio)
    return d * r > 0 and abs(d) >= MASK_FRACTION * abs(r)


# --- the sentinel's records, per host ----------------------------------------------------------
@dataclass
class SentinelTable:
    """The machine-state sentinel of one host and cohort: its points and its share of the time."""

    host: str
    cohort: str
    points: pd.DataFrame  # one row per planned sentinel environment, in run order, with at_s
    wall_s: float  # host seconds of every environment of the host that ran, sentinels included
    sentinel_wall_s: float  # of which the sentinel environments

    @property
    def share(self) -> float | None:
        """The sentinel's share of the environments' wall time (None before any ran)."""
        return self.sentinel_wall_s / self.wall_s if self.wall_s > 0 else None

    def summary(self) -> str:
        """One line: what the sentinel ran and its share of the environments' wall time."""
        ran = int(self.points["status"].isin(["passed", "failed"]).sum())
        share = "share not known yet" if self.share is None else (
            f"{self.share:.2%} of the environments' wall time ({self.sentinel_wall_s:.1f} s of "
            f"{self.wall_s:.1f} s)")  # fmt: skip
        planned, points = len(self.points), self.points["env_index"].nunique()
        return f"sentinel: {ran} of {planned} calibration environments ({points} points), {share}"

    def medians(self) -> dict[str, tuple[int, float]]:
        """Calibration workload -> (passed points, median task time in s), in run order."""
        ok = self.points[self.points["status"] == "passed"]
        return {str(w): (len(g), float(g["task_s"].median()))
                for w, g in ok.groupby("workload", sort=False)}  # fmt: skip


def tables(planned: pd.DataFrame, raw: pd.DataFrame, keys: list[str]) -> list[SentinelTable]:
    """Each host's sentinel from the planned and recorded frames (``coordinator.results.analysis``):
    its points joined with their records (by ``keys``) and its share of the time."""
    if not (planned["kind"] == KIND).any():
        return []
    points = planned[planned["kind"] == KIND].drop(columns=["kind"])
    fresh = raw[raw["kind"] == KIND].drop_duplicates(keys, keep="first")
    points = points.merge(fresh.drop(columns=["order_index", "kind"]), on=keys, how="left")
    points["status"] = points["status"].fillna("pending")
    out = []
    for (host, cohort), g in points.groupby(["host", "cohort"], sort=True):
        mine = raw[(raw["host"] == host) & (raw["cohort"] == cohort)]
        mine = mine.sort_values("order_index", kind="stable")
        wall = mine["wall_s"].fillna(0.0).to_numpy(dtype=float)
        # time into the campaign: the host seconds of the environments run before the point
        before = dict(zip(mine["order_index"], np.cumsum(wall) - wall, strict=True))
        ordered = g.sort_values("order_index", kind="stable").reset_index(drop=True)
        ordered["at_s"] = ordered["order_index"].map(before).astype(float)
        own = float(mine.loc[mine["kind"] == KIND, "wall_s"].sum())
        out.append(SentinelTable(str(host), str(cohort), ordered, float(wall.sum()), own))
    return out


@dataclass(frozen=True)
class SentinelRatio:
    """One calibration workload's medians (s) on two sides of a comparison, ratio B / A."""

    workload: str
    n_a: int
    n_b: int
    median_a: float
    median_b: float
    ratio: float


def ratios(a: SentinelTable | None, b: SentinelTable | None) -> list[SentinelRatio]:
    """The calibration workloads passed on both sides, each with its medians' ratio B / A."""
    if a is None or b is None:
        return []
    ma, mb = a.medians(), b.medians()
    return [SentinelRatio(w, ma[w][0], mb[w][0], ma[w][1], mb[w][1], mb[w][1] / ma[w][1])
            for w in ma if w in mb and ma[w][1] > 0 and mb[w][1] > 0]  # fmt: skip


def largest(found: list[SentinelRatio]) -> SentinelRatio | None:
    """The ratio farthest from 1 (in log terms): the machine's shift that compare assumes."""
    return max(found, key=lambda r: abs(math.log(r.ratio)), default=None)


def resource_of(calibration: str) -> str | None:
    """The resource a calibration workload measures (None: not one this version knows)."""
    found = CALIBRATION.get(calibration)
    return found.resources[0] if found is not None else None


def calibrations_for(calibrations: Iterable[str], workload: str) -> list[str]:
    """Of ``calibrations``, those that measure a resource ``workload`` uses
    (``Declaration.resources``); all of them for a workload this version does not know, and when
    none of its resources was measured (a campaign from before those calibrations)."""
    names = list(calibrations)
    declared = DECLARED.get(workload)
    if declared is None:
        return names
    mine = [name for name in names if resource_of(name) in declared.resources]
    return mine or names


def bearing_on(found: list[SentinelRatio], workload: str) -> list[SentinelRatio]:
    """The ratios of the calibrations that bear on ``workload`` (``calibrations_for``)."""
    mine = set(calibrations_for((r.workload for r in found), workload))
    return [r for r in found if r.workload in mine]
