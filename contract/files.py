"""Files written whole: the one atomic-write helper every package uses."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` (text is UTF-8), synced, never half-written; ``mode``
    (e.g. 0o644) is set before the file takes the name."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    try:
        if mode is not None:
            tmp.chmod(mode)
        os.replace(tmp, path)
    except OSError:  # e.g. a directory where the file goes: no stray .tmp left beside it
        tmp.unlink(missing_ok=True)
        raise
