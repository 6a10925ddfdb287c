"""What the host derives from a fixture, kept on disk beside it: its scan and the oracle's models.

A fixture never changes once built (``workloads.fixtures``), and what the host derives from it
is a pure function of the fixture and of the workload code: the oracle's scan of it (path ->
size, SHA-256) and a model of R rounds. Each campaign is a process of its own, so without this
every campaign on a host scanned every fixture and computed every model again (2.4 s of the
full campaign's preparation, the first environment of each cell waiting for its model).

A fact is a JSON file in ``.facts/`` of the fixture cache, named by the code's digest and the
SHA-256 of its key, which holds what it is of (kind, workload, seed, scale, rounds, ignore
patterns), the fixture's identity (its directory's name, device, inode and change time: a
fixture built again is a new one) and the digest of the ``workloads`` package's source
(``code_digest``: a change to a builder, a model or the oracle makes every fact a new one, and
writing a fact deletes the facts of other code). The file carries its key and the SHA-256 of
its body; one that does not parse, whose digest or key does not match or whose body is not what
its reader expects, is ignored (and written again), so a damaged or stale fact costs a
computation, never a wrong model. Written atomically (a temporary file renamed into place); a
fact that cannot be written is computed again next time. The oracle still compares every
environment's final state, byte by byte, with the model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

FACTS_DIR = ".facts"  # in the fixture cache, beside the fixtures (never a fixture's name)
CODE_PREFIX = 12  # hex digits of the code's digest that begin a fact's file name


@lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA-256 of every module of the ``workloads`` package (names and bytes, sorted)."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f"{path.name}\0{path.stat().st_size}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def fact_key(kind: str, fixture: Path, *what: object) -> list[Any]:
    """The key of a fact of ``kind`` about ``fixture``: ``what`` it is of, the fixture's
    identity and the code's digest (JSON-ready)."""
    st = os.stat(fixture)
    return [kind, *map(_plain, what), fixture.name, st.st_dev, st.st_ino, st.st_ctime_ns,
            code_digest()]  # fmt: skip


def _plain(value: object) -> Any:
    """``value`` as JSON keeps it (a tuple as a list; a float as its repr, so 1 and 1.0 differ
    from nothing else)."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return repr(value)
    return value


def _path(fixture: Path, key: list[Any]) -> Path:
    """Where the fact with ``key`` about ``fixture`` is kept: named by the code's digest (its
    first ``CODE_PREFIX`` digits) and the key's."""
    name = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:40]
    return fixture.parent / FACTS_DIR / f"{key[-1][:CODE_PREFIX]}-{name}.json"


def _prune(directory: Path) -> None:
    """Delete the facts of other code (the workloads changed since): they can never be used."""
    mine = f"{code_digest()[:CODE_PREFIX]}-"
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if entry.name.endswith(".json") and not entry.name.startswith(mine):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _digest(key: list[Any], body: Any) -> str:
    """SHA-256 of a fact's key and body, as they are written."""
    return hashlib.sha256(json.dumps([key, body], sort_keys=True).encode()).hexdigest()


def load(fixture: Path, key: list[Any]) -> Any | None:
    """The body of the fact with ``key``, or None if it is absent, damaged or not that fact."""
    try:
        kept = json.loads(_path(fixture, key).read_bytes())
        if kept["key"] == key and kept["sha256"] == _digest(key, kept["body"]):
            return kept["body"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def store(fixture: Path, key: list[Any], body: Any) -> None:
    """Keep ``body`` as the fact with ``key`` (nothing if it cannot be written)."""
    path = _path(fixture, key)
    with contextlib.suppress(OSError):
        path.parent.mkdir(exist_ok=True)
        _prune(path.parent)  # a fact is written only where none was: rarely, a few files
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"key": key, "sha256": _digest(key, body), "body": body}, f)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
