"""The workloads on the host, by name and group: each declaration with its fixture and model."""

from __future__ import annotations

import difflib
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from contract.errors import WorkloadError
from workloads import catalog, fixtures, kit, oracle
from workloads.kit import MAX_ROUNDS, Declaration, ModelState, Params

GROUP_NAMES = kit.GROUPS
MODELS_KEPT = 32  # a campaign's distinct (workload, seed, scale, rounds): 19 per plan, as a rule


class Workload(Declaration):
    """A declared workload as the host uses it: checked parameters, its fixture, its model."""

    @classmethod
    def of(cls, declared: Declaration) -> Workload:
        """The host's view of ``declared``."""
        return cls(**declared.fields())  # type: ignore[arg-type] # the same fields, by name

    def params(self, scale: float) -> Params:
        """The parameters at ``scale``; raises WorkloadError on a bad scale."""
        return fixtures.checked_params(self, scale)

    def build_fixture(self, dest: Path, seed: int, scale: float) -> None:
        """Create ``dest`` (which must not exist) holding the fixture for (seed, scale)."""
        fixtures.build_fixture(self, dest, seed, scale)

    def model(
        self, seed: int, scale: float, rounds: int, fixture: Path | None = None
    ) -> oracle.Model:
        """The final state after ``rounds`` rounds, relative to the workspace root."""
        self.check_rounds(rounds)
        p = self.params(scale)
        if fixture is None:
            fixture = fixtures.ensure_fixture(self.name, seed, scale, fixtures.default_cache())
        files, dirs = oracle.scan_cached(fixture, self.ignore)
        state = ModelState(dict(files), set(dirs), fixture)
        self.evolve(state, seed, p, rounds)
        return oracle.Model(state.files, self.ignore, frozenset(state.dirs), state.blocks)

    def check_rounds(self, rounds: int) -> None:
        """Raise WorkloadError unless 0 <= rounds <= MAX_ROUNDS."""
        if not 0 <= rounds <= MAX_ROUNDS:
            raise WorkloadError(
                f"{self.name}: rounds must be 0..{MAX_ROUNDS} (fixtures prepare that many)"
            )

    def describe(self) -> dict[str, Any]:
        """Number, name, group, summary and full-scale parameters, for listings."""
        return {
            "number": self.number,
            "name": self.name,
            "group": self.group,
            "summary": self.summary,
            "params": self.full_params,
        }


WORKLOADS: dict[str, Workload] = {name: Workload.of(d) for name, d in catalog.DECLARED.items()}
GROUPS: dict[str, list[str]] = {
    g: [n for n, wl in WORKLOADS.items() if wl.group == g] for g in GROUP_NAMES
}
# The sentinel's calibration environments: run and checked like workloads, listed nowhere.
CALIBRATIONS: dict[str, Workload] = {n: Workload.of(d) for n, d in catalog.CALIBRATION.items()}


class Models:
    """Oracle models kept for reuse by the host that computed them (in this process; on disk,
    beside the fixtures, for the campaigns after it: ``workloads.facts``).

    A model is a pure function of (workload, seed, scale, rounds) and of the fixture it starts
    from, which never changes once built: the fixture is named by its root's device, inode and
    change time, so a fixture built again gets a new model. The oracle still compares every
    environment's final state, byte by byte, with its model; only the model is not computed
    again. Kept: the ``keep`` most recently used. Safe across threads (an environment prepared
    ahead computes its model while the one before it is checked): a model being computed by one
    thread is waited for by another, never computed twice at once.
    """

    def __init__(self, keep: int = MODELS_KEPT) -> None:
        self.keep = keep
        self._kept: OrderedDict[tuple[object, ...], oracle.Model] = OrderedDict()
        self._lock = threading.Lock()
        self._computing: dict[tuple[object, ...], threading.Event] = {}

    def model(
        self, workload: Workload, seed: int, scale: float, rounds: int, fixture: Path
    ) -> oracle.Model:
        """``workload.model(seed, scale, rounds, fixture)``, computed once."""
        st = os.stat(fixture)
        key = (workload.name, seed, scale, rounds, str(fixture), st.st_dev, st.st_ino,
               st.st_ctime_ns)  # fmt: skip
        while True:
            with self._lock:
                if key in self._kept:
                    self._kept.move_to_end(key)
                    return self._kept[key]
                busy = self._computing.get(key)
                if busy is None:
                    self._computing[key] = threading.Event()
                    break
            busy.wait()  # then kept, or its computation failed: try again
        try:
            model = _kept_model(workload, seed, scale, rounds, fixture)
            with self._lock:
                self._kept[key] = model
                while len(self._kept) > self.keep:
                    self._kept.popitem(last=False)
        finally:
            with self._lock:
                self._computing.pop(key).set()
        return model


def _kept_model(
    workload: Workload, seed: int, scale: float, rounds: int, fixture: Path
) -> oracle.Model:
    """``workload.model(...)``, taken from disk if a campaign before computed it
    (``workloads.facts``), else computed and kept there."""
    from workloads import facts

    key = facts.fact_key("model", fixture, workload.name, seed, scale, rounds, workload.ignore)
    if (kept := oracle.model_from_body(facts.load(fixture, key))) is not None:
        return kept
    model = workload.model(seed, scale, rounds, fixture=fixture)
    facts.store(fixture, key, oracle.model_body(model))
    return model


def get_workload(name: str) -> Workload:
    """The workload (or calibration) called ``name``; WorkloadError with a suggestion otherwise."""
    found = WORKLOADS.get(name) or CALIBRATIONS.get(name)
    if found is None:
        raise WorkloadError(_unknown(name))
    return found


def _unknown(name: str) -> str:
    """An 'is not a workload' message with a did-you-mean suggestion when one is close."""
    choices = [*WORKLOADS, *GROUPS, "all"]
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; choose from {', '.join(WORKLOADS)}"
    return f"'{name}' is not a workload{hint}"


def resolve(names: list[str]) -> list[str]:
    """Expand workload names, group names and 'all' into workload names (first seen, no repeats)."""
    out: list[str] = []
    for name in names:
        if name == "all":
            expanded = list(WORKLOADS)
        elif name in GROUPS:
            expanded = GROUPS[name]
        else:
            expanded = [get_workload(name).name]
        out += [n for n in expanded if n not in out]
    return out
