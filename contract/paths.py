"""Where sandbench keeps its state on a machine: its home and the work root of environments.

``$SANDBENCH_HOME`` (default ``/var/lib/sandbench``) holds the host key, the trusted registry,
the private docker daemon's state, the prepared VM guest and the tools ``ops/setup.sh`` installs
that no package provides (``tools/``, or ``$SANDBENCH_TOOLS``: nsjail). The work root (default
``/var/tmp/sandbench``) holds fixtures and the environments' workspaces; a plan's specs name
it, and a worker may run them under its own.
"""

from __future__ import annotations

from pathlib import Path

from contract.environ import setting

HOME_ENV = "SANDBENCH_HOME"
TOOLS_ENV = "SANDBENCH_TOOLS"
DEFAULT_HOME = Path("/var/lib/sandbench")
DEFAULT_WORK_ROOT = Path("/var/tmp/sandbench")


def sandbench_home() -> Path:
    """This machine's sandbench home: ``$SANDBENCH_HOME``, else ``/var/lib/sandbench``."""
    return Path(setting(HOME_ENV) or DEFAULT_HOME)


def tools_dir() -> Path:
    """Where sandbench's own tools live: ``$SANDBENCH_TOOLS``, else ``<home>/tools``."""
    return Path(setting(TOOLS_ENV) or sandbench_home() / "tools")
