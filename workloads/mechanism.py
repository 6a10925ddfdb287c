"""The 12 mechanism workloads on the host side: fixture builders and final-state evolvers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from workloads import payload as pl
from workloads.base import ModelState

Params = dict[str, int]


def write(path: Path, data: bytes) -> None:
    """Create ``path`` (and its parents) holding ``data``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def tree_content(seed: int, label: str, prefix: str, p: Params) -> list[tuple[str, bytes]]:
    """(relative path, content) of a seeded tree of ``p['files']`` files in ``p['dirs']`` dirs."""
    size, paths = p["file_bytes"], pl.tree_paths(prefix, p["files"], p["dirs"])
    data = pl.stream(seed, f"{label}:tree", size * len(paths))
    return [(rel, data[i * size : (i + 1) * size]) for i, rel in enumerate(paths)]


def build_empty(*dirs: str) -> Callable[[Path, int, Params], None]:
    """A builder that creates only the directories ``dirs``."""

    def build(dest: Path, seed: int, p: Params) -> None:
        """Create the directories."""
        for d in dirs:
            (dest / d).mkdir(parents=True)

    return build


# ---------------------------------------------------------------- new files per round


def evolve_seq_write(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Round k leaves seq/round-k.bin."""
    for k in range(1, rounds + 1):
        s.put(f"seq/round-{k:02d}.bin", pl.round_bytes(seed, "seq-write", k, p["file_bytes"]))


def evolve_sync_write(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Round k leaves sync/round-k.bin."""
    for k in range(1, rounds + 1):
        s.put(f"sync/round-{k:02d}.bin", pl.round_bytes(seed, "sync-write", k, p["total_bytes"]))


def evolve_create_small(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Round k leaves the tree create/round-k."""
    size = p["file_bytes"]
    for k in range(1, rounds + 1):
        prefix = f"create/round-{k:02d}"
        s.mkdirs(*pl.tree_dirs(prefix, p["files"], p["dirs"]))
        data = pl.round_bytes(seed, "create-small", k, p["files"] * size)
        for i, rel in enumerate(pl.tree_paths(prefix, p["files"], p["dirs"])):
            s.put(rel, data[i * size : (i + 1) * size])


# ---------------------------------------------------------------- the 2,048-file tree


def build_tree(label: str, *dirs: str) -> Callable[[Path, int, Params], None]:
    """A builder of the seeded tree ``tree/``, its manifest ``tree.sha256`` and ``dirs``."""

    def build(dest: Path, seed: int, p: Params) -> None:
        """Write the tree, its manifest and the extra directories."""
        for d in dirs:
            (dest / d).mkdir()
        entries = tree_content(seed, label, "tree", p)
        for rel, data in entries:
            write(dest / rel, data)
        write(dest / "tree.sha256", pl.manifest([(rel[5:], data) for rel, data in entries]))

    return build


def evolve_nothing(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Read-only rounds leave the fixture as it was."""


def evolve_copy_tree(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Round k leaves copies/round-k, a copy of tree/."""
    for k in range(1, rounds + 1):
        dest = f"copies/round-{k:02d}"
        s.mkdirs(*(dest + d[4:] for d in pl.tree_dirs("tree", p["files"], p["dirs"])))
        for rel, data in tree_content(seed, "copy-tree", "tree", p):
            s.put(dest + rel[4:], data)


# ---------------------------------------------------------------- fixture-state workloads


def build_readdir_wide(dest: Path, seed: int, p: Params) -> None:
    """One directory of empty entries e00000..."""
    (dest / "wide").mkdir()
    for i in range(p["entries"]):
        (dest / "wide" / f"e{i:05d}").touch()


def build_read_large(dest: Path, seed: int, p: Params) -> None:
    """The large seeded file and its sha256sum line."""
    data = pl.stream(seed, "read-large", p["file_bytes"])
    write(dest / "large.bin", data)
    write(dest / "large.bin.sha256", pl.manifest([("large.bin", data)]))


def build_rename_atomic(dest: Path, seed: int, p: Params) -> None:
    """The initial target file."""
    write(dest / "atomic" / "target", pl.stream(seed, "rename-atomic:fixture", p["file_bytes"]))


def evolve_rename_atomic(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """The target holds the last replacement of the last round."""
    size, n = p["file_bytes"], p["renames"]
    if rounds:
        s.put("atomic/target", pl.round_bytes(seed, "rename-atomic", rounds, size * n)[-size:])


def build_append_fsync(dest: Path, seed: int, p: Params) -> None:
    """An empty log."""
    write(dest / "log" / "append.log", b"")


def evolve_append_fsync(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """The log holds every round's records in order."""
    s.put("log/append.log", b"".join(pl.append_records(seed, k, p) for k in range(1, rounds + 1)))


def build_delete_tree(dest: Path, seed: int, p: Params) -> None:
    """One seeded tree per round del/round-01 ... del/round-NN."""
    (dest / "del").mkdir()
    for k in range(1, p["prepared_rounds"] + 1):
        for rel, data in tree_content(seed, f"delete-tree:{k}", f"del/round-{k:02d}", p):
            write(dest / rel, data)


def evolve_delete_tree(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Rounds 1..R removed their trees."""
    for k in range(1, rounds + 1):
        s.remove_tree(f"del/round-{k:02d}")


def build_mmap_write(dest: Path, seed: int, p: Params) -> None:
    """The seeded file to be mapped."""
    write(dest / "mmap" / "map.bin", pl.stream(seed, "mmap-write", p["file_bytes"]))


def evolve_mmap_write(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Every page carries the stamps of rounds 1..R."""
    data = bytearray(s.read_fixture("mmap/map.bin"))
    for k in range(1, rounds + 1):
        for page in range(p["file_bytes"] // pl.PAGE):
            off, stamp = pl.mmap_stamp(seed, k, page)
            data[page * pl.PAGE + off : page * pl.PAGE + off + len(stamp)] = stamp
    s.put("mmap/map.bin", bytes(data))
