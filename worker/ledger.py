"""The ownership ledger of a work root: which environments it owns, written before they exist.

Before an environment creates anything (its directory under ``envs/``, its cgroup, a mount, a
container, a VM), the runner writes ``<work root>/owned/<name>.json``: the environment's name
(its directory and cgroup name), key, cgroup path and version, and the pid and start time of
the process that runs it. Cleanup removes the entry only when everything was removed. So the
reaper (``worker.reaper``) knows, from the work root alone, what is its own and whether the
process behind it is still alive: a live creator's environment is never touched, and another
work root's environments are never even seen.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

LEDGER_DIR = "owned"  # under the work root
ENVS_DIR = "envs"  # environments' directories under the work root (the runner's layout)
SUFFIX = ".json"
STARTTIME_INDEX = 19  # field 22 of /proc/PID/stat (start time), counted after the ")"


@dataclass(frozen=True)
class Entry:
    """One owned environment, as its creator wrote it."""

    name: str
    key: str
    cgroup: str  # relative to a hierarchy's root, e.g. "/sandbench/<name>"
    cgroup_version: int
    pid: int
    pid_start: int | None  # the creator's start time (clock ticks since boot)
    created_at: float

    def creator_alive(self) -> bool:
        """Whether the process that created the entry still runs (the same process, not a reuse)."""
        start = process_start(self.pid)
        return start is not None and (self.pid_start is None or start == self.pid_start)

    def live(self) -> bool:
        """Whether another live process still runs this environment (then it is not a leftover).

        The calling process's own entries are never live to it: it reaps only between its
        environments, one at a time.
        """
        return self.pid != os.getpid() and self.creator_alive()


def process_start(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot, or None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command may hold spaces and parentheses
    if len(fields) <= STARTTIME_INDEX or fields[0] == "Z":  # a zombie runs nothing
        return None
    return int(fields[STARTTIME_INDEX])


def ledger_dir(work_root: Path) -> Path:
    """The ledger directory of ``work_root``."""
    return work_root / LEDGER_DIR


def own(work_root: Path, name: str, key: str, cgroup: str, cgroup_version: int) -> Entry:
    """Write the entry of environment ``name`` (atomically) before anything of it is created."""
    entry = Entry(name, key, cgroup, cgroup_version, os.getpid(), process_start(os.getpid()),
                  time.time())  # fmt: skip
    directory = ledger_dir(work_root)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}{SUFFIX}.tmp"
    tmp.write_text(json.dumps(asdict(entry), sort_keys=True) + "\n")
    tmp.rename(directory / f"{name}{SUFFIX}")
    return entry


def release(work_root: Path, name: str) -> None:
    """Remove the entry of ``name``: everything it owned is gone."""
    (ledger_dir(work_root) / f"{name}{SUFFIX}").unlink(missing_ok=True)


def entries(work_root: Path) -> dict[str, Entry]:
    """Every entry of ``work_root``'s ledger, by environment name (unreadable ones skipped)."""
    found: dict[str, Entry] = {}
    directory = ledger_dir(work_root)
    for path in sorted(directory.glob(f"*{SUFFIX}")) if directory.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            entry = Entry(**json.loads(path.read_text()))
            if entry.name == path.name.removesuffix(SUFFIX):
                found[entry.name] = entry
    return found


def stale_temporaries(work_root: Path) -> list[Path]:
    """Half-written entries (a creator killed between write and rename)."""
    directory = ledger_dir(work_root)
    return sorted(directory.glob(f".*{SUFFIX}.tmp")) if directory.is_dir() else []
