"""The payload's body compiled once per host process, so that no environment compiles it.

The payload writes no bytecode (its directory is bound read-only into every mode, and nothing
may appear in a workspace), so each environment used to compile ``workloads/`` from source in
its first check, after Ready: about 25 ms natively and 0.3 s in a TCG guest, every time. The
runner now compiles the directory into its ``__pycache__`` before the first environment's
marker, as *checked-hash* files: an import still reads the source and compares its hash with
the one in the file, so a module edited since is compiled from source as before, never run
from stale bytecode. It compiles in this process, for this interpreter's tag (the payload's
``/usr/bin/python3`` is the one the harness's virtual environment is made from); a payload
interpreter of another version looks for its own tag and compiles from source. Nothing is
spawned for it: a wrapper standing in for the payload's interpreter (tests use one that holds
environments) is never run outside an environment. Where the directory cannot be written (a
read-only install), the payload compiles from source and the record's provenance says so.
"""

from __future__ import annotations

import py_compile
import sys
import threading
from pathlib import Path

CHECKED_HASH = py_compile.PycInvalidationMode.CHECKED_HASH
_lock = threading.Lock()
_done: dict[str, str] = {}


def ensure_bytecode(payload_dir: Path) -> str:
    """Compile ``payload_dir`` once per process: ``checked-hash <tag>``, or why not."""
    with _lock:
        if str(payload_dir) not in _done:
            _done[str(payload_dir)] = _compile(payload_dir)
        return _done[str(payload_dir)]


def _compile(payload_dir: Path) -> str:
    """Each module of the directory compiled (not recursive: the body is one package)."""
    sources = sorted(payload_dir.glob("*.py"))
    if not sources:
        return f"source (no modules in {payload_dir})"
    for source in sources:
        try:
            py_compile.compile(str(source), doraise=True, invalidation_mode=CHECKED_HASH)
        except (py_compile.PyCompileError, OSError) as exc:
            return f"source (compiling {source.name} failed: {exc})"
    return f"checked-hash {sys.implementation.cache_tag}"
