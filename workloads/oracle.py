"""The host oracle: scan a directory and list every difference from a workload's model."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from workloads.kit import Blocks, FileState

HASH_CHUNK = 1 << 20
# Files at least this large are hashed on a thread each, as many at once as the process has
# CPUs (hashlib and read() let go of the GIL): each byte is still read once; smaller files are
# hashed in the walk's thread, where a thread's hand-off would cost more than the hash.
PARALLEL_BYTES = 4 << 20
# A tree of at least this many small files has half of them hashed by a separate Python process
# (``_hash_apart``) beside this one's walk: on a file system whose copies start with a cold page
# cache (reflinks) each small file costs a read from the device, which a thread of this process
# would take turns with the walk on the GIL to overlap (measured: two threads no faster).
APART_FILES = 2000
APART_TIMEOUT_S = 600
# The other side of ``_hash_apart``: paths (JSON, surrogate-escaped) on standard input, each
# one's SHA-256 or null (not a regular file to read: then this process hashes it, and says why
# it cannot) on standard output; only the standard library, so it starts in tens of ms.
_APART_CODE = """
import hashlib, json, os, sys
out = []
for path in json.load(sys.stdin):
    try:
        fd = os.open(os.fsencode(path), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        out.append(None)
        continue
    h = hashlib.sha256()
    try:
        while chunk := os.read(fd, %d):
            h.update(chunk)
        out.append(h.hexdigest())
    except OSError:
        out.append(None)
    finally:
        os.close(fd)
json.dump(out, sys.stdout)
"""
# A file system's own bookkeeping at a mount root is never part of a workload's state.
ALWAYS_IGNORED = ("lost+found",)


@dataclass(frozen=True)
class Model:
    """Predicted final state after R rounds: relative path -> state.

    ``ignore`` lists glob patterns (relative paths) whose content is not deterministic
    (for example git's index, which records stat times); they are neither required nor
    reported as extra. ``blocks``: files predicted block by block (``kit.Blocks``), whose bytes
    ``compare`` compares with the prediction instead of hashing them.
    """

    files: dict[str, FileState]
    ignore: tuple[str, ...] = ()
    dirs: frozenset[str] = field(default_factory=frozenset)  # expected empty-or-not directories
    blocks: dict[str, Blocks] = field(default_factory=dict)


def _ignored(rel: str, patterns: Iterable[str]) -> bool:
    """Whether relative path ``rel`` matches one of the glob ``patterns``."""
    return any(fnmatch.fnmatchcase(rel, pat) for pat in patterns)


def _file_state(path: str, st: os.stat_result) -> FileState:
    """Size and SHA-256 of a regular file, or of a symlink's target string."""
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path).encode()
        return FileState(len(target), hashlib.sha256(target).hexdigest())
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    return FileState(st.st_size, h.hexdigest())


@lru_cache(maxsize=4)
def _stream(seed: int, label: str, n: int) -> bytes:
    """The seeded stream ``Blocks`` slice (``kit.stream``), made once per process."""
    from workloads.kit import stream

    return stream(seed, label, n)


def _blocks_state(path: str, st: os.stat_result, blocks: Blocks) -> FileState:
    """The state of a file predicted block by block, its bytes compared with the prediction
    (each read once): the prediction's digest if every block is equal, else a digest that names
    the first byte offset of the first block that differs (never equal to a SHA-256)."""
    size, base, zero = blocks.size, _stream(*blocks.base), bytes(blocks.size)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        for i, src in enumerate(blocks.sources):
            if os.pread(fd, size, i * size) != (zero if src < 0 else base[src : src + size]):
                return FileState(st.st_size, f"differs in the block at byte {i * size}")
        if os.pread(fd, 1, len(blocks.sources) * size):
            return FileState(st.st_size, f"differs: longer than {len(blocks.sources) * size}")
    finally:
        os.close(fd)
    return FileState(st.st_size, blocks.sha256)


def _hash_apart(paths: list[str]) -> Callable[[], list[str | None]]:
    """Start hashing the regular files ``paths`` in a separate Python process (``_APART_CODE``;
    the paths on its standard input from a memory file, so nothing waits on a pipe); a call
    that waits for their digests (None where that process could not read one, or every one if
    it failed: the caller hashes those itself)."""
    argv = [sys.executable, "-I", "-S", "-c", _APART_CODE % HASH_CHUNK]
    try:
        with os.fdopen(os.memfd_create("sandbench-oracle-paths"), "w+b") as listed:
            listed.write(json.dumps(paths).encode())
            listed.seek(0)
            proc = subprocess.Popen(argv, stdin=listed, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    except OSError:
        return lambda: [None] * len(paths)

    def digests() -> list[str | None]:
        try:
            out, _ = proc.communicate(timeout=APART_TIMEOUT_S)
            got = json.loads(out) if proc.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            got = None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if not isinstance(got, list) or len(got) != len(paths):
            return [None] * len(paths)
        return [x if isinstance(x, str) else None for x in got]

    return digests


def file_states(
    paths: list[tuple[str, os.stat_result]],
    blocks: list[Blocks | None] | None = None,
    *,
    apart: bool = False,
) -> list[FileState]:
    """``_file_state`` of each (path, lstat), in order; the large files hashed in parallel. A
    regular file of its predicted size with ``blocks[i]`` is compared block by block instead
    (``_blocks_state``), also in parallel. ``apart``: of ``APART_FILES`` small regular files or
    more, the second half is hashed by a separate process meanwhile (``_hash_apart``)."""
    predicted = blocks or [None] * len(paths)
    small = [i for i, (_, st) in enumerate(paths) if stat.S_ISREG(st.st_mode)
             and st.st_size < PARALLEL_BYTES and predicted[i] is None]  # fmt: skip
    handed: list[int] = []
    if apart and len(small) >= APART_FILES and len(os.sched_getaffinity(0)) > 1:
        handed = small[len(small) // 2 :]
        digests = _hash_apart([paths[i][0] for i in handed])

    def state(i: int) -> FileState:
        path, st = paths[i]
        expected = predicted[i]
        if (expected is not None and stat.S_ISREG(st.st_mode)
                and st.st_size == expected.size * len(expected.sources)):  # fmt: skip
            return _blocks_state(path, st, expected)
        return _file_state(path, st)

    states: list[FileState | None] = [None] * len(paths)
    large = [i for i, (_, st) in enumerate(paths) if stat.S_ISREG(st.st_mode)
             and st.st_size >= PARALLEL_BYTES]  # fmt: skip
    workers = min(len(os.sched_getaffinity(0)), len(large))
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            for i, found in zip(large, pool.map(state, large), strict=True):
                states[i] = found
    later = set(handed)
    for i in range(len(paths)):
        if states[i] is None and i not in later:
            states[i] = state(i)
    if handed:
        for i, digest in zip(handed, digests(), strict=True):
            states[i] = FileState(paths[i][1].st_size, digest) if digest else state(i)
    return [s if s is not None else state(i) for i, s in enumerate(states)]


def walk(root: Path, ignore: Iterable[str] = ()) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry below ``root`` (relative path, lstat), sorted, skipping ignored subtrees."""
    patterns = (*ALWAYS_IGNORED, *ignore)
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(os.path.join(root, rel_dir)) as it:
            entries = sorted(it, key=lambda e: e.name, reverse=True)
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if _ignored(rel, patterns):
                continue
            st = entry.stat(follow_symlinks=False)
            yield rel, st
            if stat.S_ISDIR(st.st_mode):
                stack.append(rel)


def scan_tree(
    root: Path,
    ignore: Iterable[str] = (),
    blocks: dict[str, Blocks] | None = None,
    *,
    apart: bool = False,
) -> tuple[dict[str, FileState], set[str]]:
    """Files (path -> state) and directories below ``root`` (``blocks``: files predicted block
    by block, compared with the prediction rather than hashed; ``apart``: half of a large
    tree's small files hashed by a separate process: ``file_states``)."""
    dirs: set[str] = set()
    found: list[tuple[str, os.stat_result]] = []
    for rel, st in walk(root, ignore):
        if stat.S_ISDIR(st.st_mode):
            dirs.add(rel)
        else:
            found.append((rel, st))
    expected = [blocks.get(rel) for rel, _ in found] if blocks else None
    states = file_states([(os.path.join(root, rel), st) for rel, st in found], expected,
                         apart=apart)  # fmt: skip
    return {rel: state for (rel, _), state in zip(found, states, strict=True)}, dirs


def scan(root: Path, ignore: Iterable[str] = ()) -> dict[str, FileState]:
    """Every regular file and symlink below ``root``: relative path -> size and SHA-256."""
    return scan_tree(root, ignore)[0]


@lru_cache(maxsize=32)
def _scan_cached(
    root: str, identity: tuple[int, int, int], ignore: tuple[str, ...]
) -> tuple[dict[str, FileState], frozenset[str]]:
    """``scan_tree`` memoized by path and the root directory's identity (in this process, and
    on disk beside the fixture: ``workloads.facts``)."""
    from workloads import facts

    key = facts.fact_key("scan", Path(root), ignore)
    if (kept := model_from_body(facts.load(Path(root), key))) is not None:
        return kept.files, kept.dirs
    files, dirs = scan_tree(Path(root), ignore)
    facts.store(Path(root), key, model_body(Model(files, ignore, frozenset(dirs))))
    return files, frozenset(dirs)


def model_body(model: Model) -> dict[str, Any]:
    """``model`` as JSON keeps it (the body of a fact: ``workloads.facts``); a fixture's scan is
    kept the same way, as the model of no round."""
    return {
        "files": {rel: [s.size, s.sha256] for rel, s in model.files.items()},
        "ignore": list(model.ignore), "dirs": sorted(model.dirs),
        "blocks": {rel: {"size": b.size, "base": list(b.base), "sources": b.sources,
                         "sha256": b.sha256} for rel, b in model.blocks.items()},
    }  # fmt: skip


def model_from_body(body: Any) -> Model | None:
    """The model ``model_body`` kept as ``body``; None if there is none or it is not one."""
    if body is None:
        return None
    try:
        files = {rel: FileState(size, sha) for rel, (size, sha) in body["files"].items()}
        blocks = {rel: Blocks(b["size"], (b["base"][0], b["base"][1], b["base"][2]),
                              list(b["sources"]), b["sha256"])
                  for rel, b in body["blocks"].items()}  # fmt: skip
        return Model(files, tuple(body["ignore"]), frozenset(body["dirs"]), blocks)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError):
        return None


def scan_cached(
    root: Path, ignore: tuple[str, ...] = ()
) -> tuple[dict[str, FileState], frozenset[str]]:
    """``scan_tree`` of a fixture (immutable once built), cached per process.

    The key includes the root's device, inode and change time, so a fixture rebuilt at the
    same path is scanned afresh.
    """
    st = os.stat(root)
    return _scan_cached(str(root), (st.st_dev, st.st_ino, st.st_ctime_ns), tuple(ignore))


def compare(root: Path, model: Model, *, apart: bool = True) -> list[str]:
    """One line per mismatch between ``root`` and ``model`` (missing, extra, size, hash);
    ``apart``: a large tree's small files half hashed by a separate process (``file_states``;
    not when another process already takes the second CPU)."""
    files, dirs = scan_tree(root, model.ignore, model.blocks, apart=apart)
    out: list[str] = []
    for rel in sorted(set(model.files) | set(files)):
        want, got = model.files.get(rel), files.get(rel)
        if got is None:
            out.append(f"missing: {rel}")
        elif want is None:
            out.append(f"extra: {rel}")
        elif want.size != got.size:
            out.append(f"size: {rel} expected {want.size} got {got.size}")
        elif got.sha256.startswith("differs"):  # compared block by block (``_blocks_state``)
            out.append(f"content: {rel} {got.sha256}")
        elif want.sha256 != got.sha256:
            out.append(f"hash: {rel} expected {want.sha256[:16]} got {got.sha256[:16]}")
    if model.dirs:
        out += [f"missing: {d}/" for d in sorted(model.dirs - dirs - set(files))]
        out += [f"extra: {d}/" for d in sorted(dirs - model.dirs - set(model.files))]
    return out
