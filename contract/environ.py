"""The one reader of the process environment: sandbench's settings and what children inherit.

Run-time state is passed in, never read from here (the worker's ``LabWorker``, the coordinator's
``FleetClocks``, the stores and keys the commands build). What the environment still sets is
where things are on this machine and which binaries to use: ``$SANDBENCH_HOME``,
``$SANDBENCH_TOOLS``, ``$SANDBENCH_FIXTURE_CACHE``, ``$SANDBENCH_BROKER``, the private docker
and podman daemons' directories and binaries, ``$SANDBENCH_PYTHON`` (the payload's
interpreter), ... (each named where it is used, as a ``*_ENV`` constant). They are read here,
when they are needed, so that a unit file or a test sets them as a user does. The lint refuses
``os.environ`` anywhere else (ruff's banned-api, pyproject.toml).
"""

from __future__ import annotations

import os


def setting(name: str, default: str | None = None) -> str | None:
    """``$name`` when it is set and not empty, else ``default``."""
    return os.environ.get(name) or default


def inherited() -> dict[str, str]:
    """A copy of this process's environment: what a child would inherit, to pass on or pick."""
    return dict(os.environ)
