"""Where sandbench keeps its state on a machine: its home and the work root of environments.

``$SANDBENCH_HOME`` (default ``/var/lib/sandbench``) holds the host key, the trusted registry,
the private docker daemon's state and the prepared VM guest. The work root (default
``/var/tmp/sandbench``) holds fixtures and the environments' workspaces; a plan's specs name
it, and a worker may run them under its own.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "SANDBENCH_HOME"
DEFAULT_HOME = Path("/var/lib/sandbench")
DEFAULT_WORK_ROOT = Path("/var/tmp/sandbench")


def sandbench_home() -> Path:
    """This machine's sandbench home: ``$SANDBENCH_HOME``, else ``/var/lib/sandbench``."""
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME)
