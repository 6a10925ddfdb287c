"""What a workload is on the host side: parameters, fixture builder, final-state model."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from workloads import payload

Group = Literal["mechanism", "resource", "workflow"]


@dataclass(frozen=True)
class FileState:
    """Expected (or observed) state of one regular file or symlink."""

    size: int
    sha256: str


@dataclass(frozen=True)
class Model:
    """Predicted final state after R rounds: relative path -> state.

    ``ignore`` lists glob patterns (relative paths) whose content is not deterministic
    (for example git's index, which records stat times); they are neither required nor
    reported as extra.
    """

    files: dict[str, FileState]
    ignore: tuple[str, ...] = ()
    dirs: frozenset[str] = field(default_factory=frozenset)  # expected empty-or-not directories


def state_of(data: bytes) -> FileState:
    """The FileState of a file with content ``data``."""
    return FileState(len(data), hashlib.sha256(data).hexdigest())


@dataclass
class ModelState:
    """The mutable state a workload's model evolves from its fixture, round by round."""

    files: dict[str, FileState]
    dirs: set[str]
    fixture: Path  # the built fixture, for content the rounds derive from

    def put(self, rel: str, data: bytes) -> None:
        """Predict file ``rel`` with content ``data`` (its parents must be predicted dirs)."""
        self.files[rel] = state_of(data)

    def mkdirs(self, *rels: str) -> None:
        """Predict directories ``rels``."""
        self.dirs.update(rels)

    def remove_tree(self, rel: str) -> None:
        """Predict that directory ``rel`` and everything below it are gone."""
        prefix = rel + "/"
        self.files = {p: s for p, s in self.files.items() if not p.startswith(prefix)}
        self.dirs = {d for d in self.dirs if d != rel and not d.startswith(prefix)}

    def read_fixture(self, rel: str) -> bytes:
        """Content of ``rel`` in the fixture."""
        return (self.fixture / rel).read_bytes()


Builder = Callable[[Path, int, dict[str, int]], None]
Evolver = Callable[[ModelState, int, dict[str, int], int], None]


@dataclass(frozen=True)
class Workload:
    """One of the 19 workloads: its definition, fixture builder and final-state model."""

    name: str
    number: int
    group: Group
    summary: str
    builder: Builder  # fills an existing empty directory with the fixture
    evolver: Evolver  # applies rounds 1..R to the fixture's state
    ignore: tuple[str, ...] = ()  # non-deterministic paths, skipped by the oracle and digests
    seeded_fixture: bool = True  # False when the fixture holds no seeded content

    @property
    def full_params(self) -> dict[str, int]:
        """The parameters at scale 1.0 (the design's table)."""
        return dict(payload.FULL_PARAMS[self.name])

    def params(self, scale: float) -> dict[str, int]:
        """The parameters at ``scale``; raises WorkloadError on a bad scale."""
        from tasks.errors import WorkloadError

        try:
            return payload.params(self.name, scale)
        except payload.PayloadError as exc:
            raise WorkloadError(f"{self.name}: {exc}") from None

    def build_fixture(self, dest: Path, seed: int, scale: float) -> None:
        """Create ``dest`` (which must not exist) holding the fixture for (seed, scale)."""
        p = self.params(scale)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.mkdir()
        self.builder(dest, seed, p)

    def model(self, seed: int, scale: float, rounds: int, fixture: Path | None = None) -> Model:
        """The final state after ``rounds`` rounds, relative to the workspace root."""
        from workloads import fixtures, oracle

        self.check_rounds(rounds)
        p = self.params(scale)
        if fixture is None:
            fixture = fixtures.ensure_fixture(self.name, seed, scale, fixtures.default_cache())
        files, dirs = oracle.scan_cached(fixture, self.ignore)
        state = ModelState(dict(files), set(dirs), fixture)
        self.evolver(state, seed, p, rounds)
        return Model(state.files, self.ignore, frozenset(state.dirs))

    def check_rounds(self, rounds: int) -> None:
        """Raise WorkloadError unless 0 <= rounds <= MAX_ROUNDS."""
        from tasks.errors import WorkloadError

        if not 0 <= rounds <= payload.MAX_ROUNDS:
            raise WorkloadError(
                f"{self.name}: rounds must be 0..{payload.MAX_ROUNDS} (fixtures prepare that many)"
            )

    def describe(self) -> dict[str, Any]:
        """Name, number, group, summary and full-scale parameters, for listings."""
        return {
            "number": self.number,
            "name": self.name,
            "group": self.group,
            "summary": self.summary,
            "params": self.full_params,
        }
