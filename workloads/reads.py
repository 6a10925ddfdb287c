"""Mechanism workloads of reads and metadata: each declared once, at the bottom.

The read workloads keep their reading and hashing inside the round clock: that is their work.
"""

from __future__ import annotations

import hashlib
import os
import stat

from workloads.kit import (
    MAX_ROUNDS,
    Declaration,
    KiB,
    MiB,
    ModelState,
    Param,
    Params,
    PayloadError,
    check_manifest,
    fsync_path,
    io_unit,
    manifest,
    put_file,
    read_file,
    scaled_bytes,
    scaled_count,
    sha_file,
    stream,
    tree_dirs,
    tree_paths,
    write_new,
)

TYPE_CHECKING = False  # ``pathlib`` is not imported at run time (``workloads.kit``)
if TYPE_CHECKING:
    from pathlib import Path

    from workloads.kit import Builder, Check

# ---------------------------------------------------------------- the 2,048-file tree


def tree_content(seed: int, label: str, prefix: str, p: Params) -> list[tuple[str, bytes]]:
    """(relative path, content) of a seeded tree of ``p['files']`` files in ``p['dirs']`` dirs."""
    size, paths = p["file_bytes"], tree_paths(prefix, p["files"], p["dirs"])
    data = stream(seed, f"{label}:tree", size * len(paths))
    return [(rel, data[i * size : (i + 1) * size]) for i, rel in enumerate(paths)]


def build_tree(label: str, *dirs: str) -> Builder:
    """A builder of the seeded tree ``tree/``, its manifest ``tree.sha256`` and ``dirs``."""

    def build(dest: Path, seed: int, p: Params) -> None:
        """Write the tree, its manifest and the extra directories."""
        for d in dirs:
            (dest / d).mkdir()
        entries = tree_content(seed, label, "tree", p)
        for rel, data in entries:
            put_file(dest / rel, data)
        put_file(dest / "tree.sha256", manifest([(rel[5:], data) for rel, data in entries]))

    return build


def evolve_nothing(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Read-only rounds leave the fixture as it was."""


def read_small(root: str, seed: int, p: Params, k: int) -> tuple[str, bool]:
    """Read and hash every file of the fixture tree, checking the manifest.

    Clock: reading and hashing every file (the work itself) and the comparison.
    """
    return check_manifest(os.path.join(root, "tree"), os.path.join(root, "tree.sha256"))


def stat_tree(root: str, seed: int, p: Params, k: int) -> tuple[str, bool]:
    """lstat every entry of the fixture tree several times.

    Clock: every pass's lstat and directory scan, and the comparison with the expected tree.
    """
    files, dirs = (
        tree_paths("tree", p["files"], p["dirs"]),
        tree_dirs("tree", p["files"], p["dirs"]),
    )
    want = set(files) | set(dirs)
    seen: dict[str, int] = {}
    for _ in range(p["passes"]):
        seen = {}
        stack = ["tree"]
        while stack:
            rel = stack.pop()
            st = os.lstat(os.path.join(root, rel))
            seen[rel] = st.st_size if not stat.S_ISDIR(st.st_mode) else -1
            if seen[rel] == -1:
                stack.extend(f"{rel}/{e.name}" for e in os.scandir(os.path.join(root, rel)))
    digest = hashlib.sha256(repr(sorted(seen.items())).encode()).hexdigest()
    sizes_ok = all(v in (-1, p["file_bytes"]) for v in seen.values())
    return digest, set(seen) == want and sizes_ok


def copy_tree(root: str, seed: int, p: Params, k: int) -> Check:
    """Copy the fixture tree into a new directory, fsync files and directories.

    Clock: reading the sources, writing and fsyncing the copies and their directories.
    After it: the copies are hashed against the tree's manifest.
    """
    dest = os.path.join(root, "copies", f"round-{k:02d}")
    dirs = tree_dirs("tree", p["files"], p["dirs"])
    for d in dirs:
        os.mkdir(os.path.join(dest, d[5:]) if d != "tree" else dest)
    for rel in tree_paths("tree", p["files"], p["dirs"]):
        write_new(os.path.join(dest, rel[5:]), read_file(os.path.join(root, rel)))
    for d in reversed(dirs):
        fsync_path(os.path.join(dest, d[5:]) if d != "tree" else dest)
    fsync_path(os.path.dirname(dest))
    return lambda: check_manifest(dest, os.path.join(root, "tree.sha256"))


def evolve_copy_tree(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Round k leaves copies/round-k, a copy of tree/."""
    for k in range(1, rounds + 1):
        dest = f"copies/round-{k:02d}"
        s.mkdirs(*(dest + d[4:] for d in tree_dirs("tree", p["files"], p["dirs"])))
        for rel, data in tree_content(seed, "copy-tree", "tree", p):
            s.put(dest + rel[4:], data)


# ---------------------------------------------------------------- readdir-wide, read-large


def readdir_wide(root: str, seed: int, p: Params, k: int) -> tuple[str, bool]:
    """List one wide directory several times; every listing must be complete.

    Clock: every listing and its comparison with the expected names.
    """
    want = sorted(f"e{i:05d}" for i in range(p["entries"]))
    ok = True
    for _ in range(p["passes"]):
        ok = ok and sorted(os.listdir(os.path.join(root, "wide"))) == want
    return hashlib.sha256("\n".join(want).encode()).hexdigest(), ok


def build_readdir_wide(dest: Path, seed: int, p: Params) -> None:
    """One directory of empty entries e00000..."""
    (dest / "wide").mkdir()
    for i in range(p["entries"]):
        (dest / "wide" / f"e{i:05d}").touch()


def read_large(root: str, seed: int, p: Params, k: int) -> tuple[str, bool]:
    """Read the large fixture file and verify its SHA-256 against the fixture's.

    Clock: reading and hashing the whole file (the work itself) and the comparison.
    """
    got = sha_file(os.path.join(root, "large.bin"), p["read_bytes"])
    want = read_file(os.path.join(root, "large.bin.sha256")).decode().split()[0]
    return got, got == want


def build_read_large(dest: Path, seed: int, p: Params) -> None:
    """The large seeded file and its sha256sum line."""
    data = stream(seed, "read-large", p["file_bytes"])
    put_file(dest / "large.bin", data)
    put_file(dest / "large.bin.sha256", manifest([("large.bin", data)]))


# ---------------------------------------------------------------- delete-tree


def delete_tree(root: str, seed: int, p: Params, k: int) -> tuple[str, bool]:
    """Delete the tree the fixture prepared for round ``k``, fsync its parent.

    Clock: the walk, every unlink and rmdir, and the parent's fsync.
    """
    top, removed = os.path.join(root, "del", f"round-{k:02d}"), 0
    if not os.path.isdir(top):
        raise PayloadError(f"delete-tree: {top} is missing (was round {k} already run?)")
    for here, dirs, files in os.walk(top, topdown=False):
        for name in files:
            os.unlink(os.path.join(here, name))
            removed += 1
        for name in dirs:
            os.rmdir(os.path.join(here, name))
    os.rmdir(top)
    fsync_path(os.path.join(root, "del"))
    return hashlib.sha256(f"{k}:{removed}".encode()).hexdigest(), removed == p["files"]


def build_delete_tree(dest: Path, seed: int, p: Params) -> None:
    """One seeded tree per round del/round-01 ... del/round-NN."""
    (dest / "del").mkdir()
    for k in range(1, p["prepared_rounds"] + 1):
        for rel, data in tree_content(seed, f"delete-tree:{k}", f"del/round-{k:02d}", p):
            put_file(dest / rel, data)


def evolve_delete_tree(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Rounds 1..R removed their trees."""
    for k in range(1, rounds + 1):
        s.remove_tree(f"del/round-{k:02d}")


# ---------------------------------------------------------------- the declarations


def tree_params(**extra: int) -> dict[str, int | Param]:
    """The 2,048-file tree's parameters (32 directories of 4 KiB files), plus ``extra``."""
    return {"files": scaled_count(2048), "dirs": scaled_count(32, at_most="files"),
            "file_bytes": scaled_bytes(4 * KiB), **extra}  # fmt: skip


# fmt: off
DECLARED = (
    Declaration(
        4, "read-small", "mechanism", "reads",
        "read and hash all 2,048 files of the fixture tree (32 x 64)",
        tree_params(), read_small, build_tree("read-small"), evolve_nothing,
        resources=("cpu", "read", "metadata"),
    ),
    Declaration(
        5, "stat-tree", "mechanism", "reads",
        "lstat every entry of the 2,048-file tree 4 times",
        tree_params(passes=4), stat_tree, build_tree("stat-tree"), evolve_nothing,
        resources=("cpu", "metadata"),
    ),
    Declaration(
        6, "readdir-wide", "mechanism", "reads",
        "list one directory of 8,192 entries 8 times",
        {"entries": scaled_count(8192), "passes": 8},
        readdir_wide, build_readdir_wide, evolve_nothing, seeded_fixture=False,
        resources=("cpu", "metadata"),
    ),
    Declaration(
        7, "read-large", "mechanism", "reads",
        "read a 64 MiB fixture file and verify its SHA-256",
        {"file_bytes": scaled_bytes(64 * MiB), "read_bytes": io_unit(MiB, "file_bytes")},
        read_large, build_read_large, evolve_nothing,
        resources=("cpu", "read"),
    ),
    Declaration(
        10, "delete-tree", "mechanism", "reads",
        "delete the fixture tree prepared for round k (1,024 files)",
        {"files": scaled_count(1024), "dirs": scaled_count(32, at_most="files"),
         "file_bytes": scaled_bytes(4 * KiB), "prepared_rounds": MAX_ROUNDS},
        delete_tree, build_delete_tree, evolve_delete_tree,
        resources=("cpu", "metadata", "fsync"),
    ),
    Declaration(
        12, "copy-tree", "mechanism", "reads",
        "copy the 2,048-file tree into a new directory, fsync",
        tree_params(), copy_tree, build_tree("copy-tree", "copies"), evolve_copy_tree,
        resources=("cpu", "read", "metadata", "fsync"),
    ),
)
# fmt: on
