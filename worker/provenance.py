"""A host's provenance for one campaign: host facts plus harness, plan and run context."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from tasks.stamps import utc_now
from worker.hostinfo import host_facts
from worker.modes import tool_commands

REPO = Path(__file__).resolve().parents[1]
GIT_TIMEOUT_S = 10


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(REPO), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
    )


def harness_commit() -> str:
    """The harness's git commit (with ``-dirty`` when the tree has changes), or ``unknown``."""
    try:
        head = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def collect(
    host: str,
    work_root: Path,
    *,
    campaign: str,
    seed: int,
    cohort: str,
    quota: dict[str, Any],
    modes: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Provenance of ``host`` for ``campaign``: facts, harness, seed, cohort, quota, modes."""
    try:
        version = metadata.version("sandbench")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "host": host,
        "campaign": campaign,
        "date": utc_now(),
        "seed": seed,
        "cohort": cohort,
        "quota": quota,
        "harness": {
            "commit": harness_commit(),
            "version": version,
            "python": sys.version.split()[0],
        },
        **host_facts(work_root, tool_commands()),
        "modes": modes or {},
    }
