"""A host's provenance for one campaign: host facts plus harness, plan and run context."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from contract.stamps import utc_now
from worker.hostinfo import host_facts
from worker.modes import tool_commands

REPO = Path(__file__).resolve().parents[1]
GIT_TIMEOUT_S = 10
# An installed harness (a venv, not a checkout) has no git tree: ops/install.sh writes the commit
# of the repository it installed from into this file of the venv (``sys.prefix``).
COMMIT_FILE = "sandbench-commit"
COMMIT = re.compile(r"[0-9a-f]{40}(-dirty)?")
UNKNOWN = "unknown"


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
    )


def git_commit(repo: Path) -> str:
    """``repo``'s git commit (with ``-dirty`` when tracked files changed), or ``unknown``."""
    try:
        head = _git(repo, "rev-parse", "HEAD")
        dirty = _git(repo, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return UNKNOWN
    commit = head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    return commit if head.returncode == 0 and COMMIT.fullmatch(commit) else UNKNOWN


def harness_commit() -> str:
    """The running harness's commit: its checkout's, else the one recorded in its venv at
    install time (``COMMIT_FILE``), else ``unknown``."""
    commit = git_commit(REPO)
    return commit if commit != UNKNOWN else recorded_commit(Path(sys.prefix) / COMMIT_FILE)


def recorded_commit(path: Path) -> str:
    """The commit a ``COMMIT_FILE`` holds (a venv's, or a wheelhouse's), or ``unknown``."""
    try:
        recorded = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return UNKNOWN
    return recorded if COMMIT.fullmatch(recorded) else UNKNOWN


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
