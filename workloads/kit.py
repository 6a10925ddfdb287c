"""What every workload is written with: its declaration, parameters, seeded bytes, file helpers.

Standard library only: this module and the workload modules run inside every mode (the
payload's body), and on the host, where the fixture builders and models run. A workload is
declared once, as a ``Declaration`` in its family module; ``workloads.catalog`` collects them.
"""

from __future__ import annotations

import errno
import hashlib
import os

# The payload imports this module after Ready, in every mode, before its first answer: it keeps
# to modules the interpreter has cheaply (no ``dataclasses``, which imports ``inspect`` and
# ``ast``; no ``typing`` and no ``pathlib``, which imports ``re``, ``fnmatch`` and
# ``urllib.parse``, at run time: paths are strings inside an environment, ``Path`` only names
# the fixture builders' host-side argument). In gVisor each module imported costs about 2 ms,
# in a TCG guest tens of ms (``tests/test_imports.py`` holds the payload to its list).
# Nor ``collections`` (``collections.abc`` imports it, with ``operator``, ``keyword`` and
# ``reprlib``: about 2 ms here): the callable types below are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import TypeAlias, TypeVar

    T = TypeVar("T")
    Check: TypeAlias = Callable[[], tuple[str, bool]]  # a read-back check, run after the clock
    # A round returns (digest, ok), or a Check that returns them when the host asks (``check k``).
    Round: TypeAlias = Callable[[str, int, "Params", int], "tuple[str, bool] | Check"]
    Builder: TypeAlias = Callable[[Path, int, "Params"], None]  # fills an empty fixture directory
    Evolver: TypeAlias = Callable[["ModelState", int, "Params", int], None]  # rounds 1..R, modelled
    Prepare: TypeAlias = Callable[[int, "Params", int], None]  # round k's inputs, made ahead
    Shape: TypeAlias = Callable[["Params"], None]  # fixes parameters that depend on each other

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
PAGE = 4 * KiB
MIN_BYTES = 4 * KiB  # --scale never shrinks a byte size below this
MAX_ROUNDS = 10  # fixtures prepare state for rounds 1..MAX_ROUNDS (delete-tree's trees)
GROUPS = ("mechanism", "resource", "workflow")
# The modules that declare workloads (``DECLARED``), each named once here: the catalog imports
# them all, the payload only until it finds its own workload (``workloads.protocol``).
FAMILIES = ("writes", "reads", "working_set", "workflow")
CALIBRATION = "calibration"  # the sentinel's calibrations, declared the same way
SECTIONS = ("workflows", "writes", "reads", "resource")  # the report's sections, in its order
# What a round's time depends on, as the machine-state sentinel measures it (one calibration
# each): the interpreter's CPU, durable writes, file-system metadata, page-cache reads.
RESOURCES = ("cpu", "fsync", "metadata", "read")


class PayloadError(Exception):
    """A protocol, parameter or workspace problem (the payload answers it with an error line)."""


# ---------------------------------------------------------------- declarations

Params = dict[str, int]


class Param:
    """A full-scale parameter and what ``--scale`` does to it (a plain int stays fixed)."""

    __slots__ = ("bound", "kind", "value")

    def __init__(self, value: int, kind: str, bound: str | None = None) -> None:
        self.value = value
        self.kind = kind  # "bytes" (whole pages, >= 4 KiB), "count" (>= 1) or "unit" (I/O size)
        self.bound = bound  # never above this parameter (after scaling)

    def __repr__(self) -> str:
        return f"Param({self.value!r}, {self.kind!r}, {self.bound!r})"


def scaled_bytes(value: int) -> Param:
    """A byte size that ``--scale`` shrinks to whole 4 KiB pages, never below 4 KiB."""
    return Param(value, "bytes")


def scaled_count(value: int, at_most: str | None = None) -> Param:
    """A count that ``--scale`` shrinks, never below 1 (nor above parameter ``at_most``)."""
    return Param(value, "count", at_most)


def io_unit(value: int, within: str) -> Param:
    """An I/O size: not scaled, but never larger than the (scaled) size ``within``."""
    return Param(value, "unit", within)


class Declaration:
    """One workload, declared once: what it is, how it scales and where each part lives."""

    def __init__(
        self,
        number: int,
        name: str,
        group: str,
        section: str,
        summary: str,
        parameters: Mapping[str, int | Param],
        round: Round,
        build: Builder,
        evolve: Evolver,
        inputs: Prepare | None = None,
        shape: Shape | None = None,
        ignore: tuple[str, ...] = (),
        seeded_fixture: bool = True,
        resources: tuple[str, ...] = ("cpu",),
        preload: tuple[str, ...] = (),
    ) -> None:
        self.number = number  # its row in the design's table (and the listing order)
        self.name = name
        self.group = group  # one of GROUPS
        self.section = section  # the report section it is shown in, one of SECTIONS
        self.summary = summary  # one line: what one round does
        self.parameters = parameters  # at full scale
        self.round = round  # runs in the environment; its docstring says what its clock covers
        self.build = build  # the fixture, built once per host, seed and scale
        self.evolve = evolve  # the oracle's model: the fixture's state after rounds 1..R
        self.inputs = inputs  # makes what round k consumes ahead, before its clock starts
        self.shape = shape
        self.ignore = ignore  # non-deterministic paths, skipped by the oracle and digests
        self.seeded_fixture = seeded_fixture  # False when the fixture holds no seeded content
        self.resources = resources  # of RESOURCES: what its time depends on
        # Modules its round imports where it runs them (``subprocess`` for the tools): the
        # payload imports them with the body, before its first answer, never inside a clock;
        # the family imports them no further up, so its other workloads do not load them.
        self.preload = preload

    def fields(self) -> dict[str, object]:
        """The declaration's fields by name (what the host's ``Workload`` is built from)."""
        return dict(vars(self))

    def __repr__(self) -> str:
        return f"Declaration({self.number!r}, {self.name!r}, ...)"

    @property
    def full_params(self) -> Params:
        """The parameters at scale 1.0 (the design's table)."""
        return {k: v.value if isinstance(v, Param) else v for k, v in self.parameters.items()}

    def scaled(self, scale: float) -> Params:
        """The parameters at ``scale``, names and structure kept; PayloadError outside (0, 1]."""
        if not 0 < scale <= 1:
            raise PayloadError(f"scale {scale!r} must be in (0, 1]")
        p = {k: _scale(v, scale) for k, v in self.parameters.items()}
        for key, spec in self.parameters.items():
            if isinstance(spec, Param) and spec.bound is not None and p.get(spec.bound):
                p[key] = min(p[key], p[spec.bound])
        if self.shape is not None:
            self.shape(p)
        return p


def _scale(spec: int | Param, scale: float) -> int:
    """One parameter at ``scale``, before its bound applies."""
    if not isinstance(spec, Param) or spec.kind == "unit":
        return spec.value if isinstance(spec, Param) else spec
    if spec.kind == "bytes":
        return max(MIN_BYTES, int(spec.value * scale) // PAGE * PAGE)
    return max(1, round(spec.value * scale))


# ---------------------------------------------------------------- seeded bytes

# What a round consumes but does not do as its work (seeded bytes, a write schedule) is made
# ahead, when the host asks to check the round before (``check k-1``), outside both clocks.
_AHEAD: dict[tuple[object, ...], object] = {}


def ahead(key: tuple[object, ...], compute: Callable[[], T]) -> T:
    """The value ``prepare`` made for ``key`` ahead of the round (taken once), else compute()."""
    if key in _AHEAD:
        return _AHEAD.pop(key)  # type: ignore[return-value] # what prepare() made for key
    return compute()


def prepare(key: tuple[object, ...], compute: Callable[[], object]) -> None:
    """Compute a value a coming round will take with ``ahead(key, ...)``."""
    _AHEAD[key] = compute()


def forget_prepared() -> None:
    """Drop every value made ahead (before the next round's are made)."""
    _AHEAD.clear()


def _shake(seed: int, label: str, n: int) -> bytes:
    """SHAKE-256 of (seed, label): the one source of every workload's pseudo-random bytes."""
    return hashlib.shake_256(f"sandbench:{seed}:{label}".encode()).digest(n)


def stream(seed: int, label: str, n: int) -> bytes:
    """``n`` pseudo-random bytes determined by (seed, label) alone."""
    return ahead(("stream", seed, label, n), lambda: _shake(seed, label, n))


def stream_ahead(seed: int, label: str, n: int) -> None:
    """Generate ``stream(seed, label, n)`` now, so the round that needs it does not."""
    prepare(("stream", seed, label, n), lambda: _shake(seed, label, n))


def round_bytes(seed: int, name: str, k: int, n: int) -> bytes:
    """The content a round ``k`` of workload ``name`` writes (``n`` bytes)."""
    return stream(seed, f"{name}:round:{k}", n)


def round_bytes_ahead(name: str, size: Callable[[Params], int]) -> Prepare:
    """An ``inputs`` hook that makes round k's ``round_bytes`` of ``name`` ahead."""
    return lambda seed, p, k: stream_ahead(seed, f"{name}:round:{k}", size(p))


def manifest(entries: list[tuple[str, bytes]]) -> bytes:
    """A sha256sum-format manifest of (name, content) pairs."""
    return "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in entries).encode()


def tree_paths(prefix: str, files: int, dirs: int) -> list[str]:
    """Relative paths of a ``files``-file tree spread over ``dirs`` directories."""
    per_dir = -(-files // dirs)
    return [f"{prefix}/d{i // per_dir:02d}/f{i % per_dir:04d}.dat" for i in range(files)]


def tree_dirs(prefix: str, files: int, dirs: int) -> list[str]:
    """The directories ``tree_paths`` uses, parents first."""
    per_dir = -(-files // dirs)
    return [prefix] + [f"{prefix}/d{i:02d}" for i in range(-(-files // per_dir))]


def create_tree(root: str, prefix: str, parent: str, data: bytes, p: Params) -> Check:
    """Create ``p["files"]`` files of ``p["file_bytes"]`` (slices of ``data``) in
    ``p["dirs"]`` new directories under ``prefix``, then fsync the directories and ``parent``
    (no file's own fsync); the check that reads them back. create-small and the sentinel's
    metadata calibration are this."""
    size, paths = p["file_bytes"], tree_paths(prefix, p["files"], p["dirs"])
    dirs = tree_dirs(prefix, p["files"], p["dirs"])
    for d in dirs:
        os.mkdir(os.path.join(root, d))
    for i, rel in enumerate(paths):
        write_new(os.path.join(root, rel), data[i * size : (i + 1) * size], sync=False)
    for d in [*reversed(dirs), parent]:
        fsync_path(os.path.join(root, d))

    def check() -> tuple[str, bool]:
        """Read the files back."""
        got = hashlib.sha256(b"".join(read_file(os.path.join(root, r)) for r in paths))
        return got.hexdigest(), got.hexdigest() == hashlib.sha256(data).hexdigest()

    return check


def predict_tree(s: ModelState, prefix: str, data: bytes, p: Params) -> None:
    """The model of ``create_tree``: its directories and files."""
    size = p["file_bytes"]
    s.mkdirs(*tree_dirs(prefix, p["files"], p["dirs"]))
    for i, rel in enumerate(tree_paths(prefix, p["files"], p["dirs"])):
        s.put(rel, data[i * size : (i + 1) * size])


# ---------------------------------------------------------------- file helpers


def fsync_path(path: str) -> None:
    """fsync a file or directory by path (directories where the file system allows it)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    try:
        os.fsync(fd)
    except OSError as exc:  # 9p and some FUSE file systems refuse fsync on a directory
        if not os.path.isdir(path) or exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
    """Write all of ``data`` (at ``offset`` with pwrite): short writes are continued."""
    view = memoryview(data)
    while view:
        done = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[done:]
        offset = None if offset is None else offset + done


def write_new(path: str, data: bytes, chunk: int = 0, sync: bool = True) -> None:
    """Create ``path`` (it must not exist) with ``data`` in ``chunk``-sized writes, fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view, step = memoryview(data), chunk or len(data) or 1
        for off in range(0, len(data), step):
            write_all(fd, view[off : off + step])
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path: str) -> bytes:
    """The whole content of ``path``."""
    with open(path, "rb") as f:
        return f.read()


def sha_file(path: str, chunk: int = MiB) -> str:
    """SHA-256 hex of the file at ``path``, read in ``chunk``-sized reads."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def check_manifest(base: str, manifest_path: str) -> tuple[str, bool]:
    """Hash every file a manifest lists (relative to ``base``); digest and whether all match."""
    h, ok = hashlib.sha256(), True
    for line in read_file(manifest_path).decode().splitlines():
        want, name = line.split("  ", 1)
        got = sha_file(os.path.join(base, name))
        h.update(got.encode())
        ok = ok and got == want
    return h.hexdigest(), ok


def put_file(path: Path, data: bytes) -> None:
    """Create ``path`` (and its parents) holding ``data`` (fixture builders)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def empty_dirs(*dirs: str) -> Builder:
    """A fixture builder that creates only the directories ``dirs``."""

    def build(dest: Path, seed: int, p: Params) -> None:
        """Create the directories."""
        for d in dirs:
            (dest / d).mkdir(parents=True)

    return build


# ---------------------------------------------------------------- the model's state


class FileState:
    """Expected (or observed) state of one regular file or symlink: equal when both are."""

    __slots__ = ("sha256", "size")

    def __init__(self, size: int, sha256: str) -> None:
        self.size = size
        self.sha256 = sha256

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FileState):
            return NotImplemented
        return self.size == other.size and self.sha256 == other.sha256

    def __hash__(self) -> int:
        return hash((self.size, self.sha256))

    def __repr__(self) -> str:
        return f"FileState(size={self.size!r}, sha256={self.sha256!r})"


def state_of(data: bytes) -> FileState:
    """The FileState of a file with content ``data``."""
    return FileState(len(data), hashlib.sha256(data).hexdigest())


class Blocks:
    """A predicted file's content as whole blocks: block i holds ``size`` bytes of the seeded
    stream (seed, label, n) from offset ``sources[i]``, or zeros where that is -1. The oracle
    compares such a file's bytes with these (one read of each byte, no hash to compute);
    ``sha256`` is the content's digest all the same (the working-set files)."""

    __slots__ = ("base", "sha256", "size", "sources")

    def __init__(
        self, size: int, base: tuple[int, str, int], sources: list[int], sha256: str
    ) -> None:
        self.size = size
        self.base = base  # (seed, label, n) of ``stream``
        self.sources = sources
        self.sha256 = sha256


class ModelState:
    """The state a workload's model evolves from its fixture, round by round."""

    def __init__(self, files: dict[str, FileState], dirs: set[str], fixture: Path) -> None:
        self.files = files
        self.dirs = dirs
        self.fixture = fixture  # the built fixture, for content the rounds derive from
        self.blocks: dict[str, Blocks] = {}  # files predicted block by block (``Blocks``)

    def put(self, rel: str, data: bytes) -> None:
        """Predict file ``rel`` with content ``data`` (its parents must be predicted dirs)."""
        self.files[rel] = state_of(data)
        self.blocks.pop(rel, None)

    def put_blocks(self, rel: str, blocks: Blocks) -> None:
        """Predict file ``rel`` block by block."""
        self.files[rel] = FileState(blocks.size * len(blocks.sources), blocks.sha256)
        self.blocks[rel] = blocks

    def mkdirs(self, *rels: str) -> None:
        """Predict directories ``rels``."""
        self.dirs.update(rels)

    def remove_tree(self, rel: str) -> None:
        """Predict that directory ``rel`` and everything below it are gone."""
        prefix = rel + "/"
        self.files = {p: s for p, s in self.files.items() if not p.startswith(prefix)}
        self.blocks = {p: b for p, b in self.blocks.items() if not p.startswith(prefix)}
        self.dirs = {d for d in self.dirs if d != rel and not d.startswith(prefix)}

    def read_fixture(self, rel: str) -> bytes:
        """Content of ``rel`` in the fixture."""
        return (self.fixture / rel).read_bytes()
