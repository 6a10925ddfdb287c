"""What a workload is on the host side: parameters, fixture builder, final-state model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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
