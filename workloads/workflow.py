"""The workflow workloads: a git repository, an incremental C build, a publication.

Each is declared once, at the bottom; every round function's docstring says what its round
clock covers. git, make and gcc are the host's own (every mode runs the same toolset) and run
with a clean environment (``tool_env``): no user or system configuration, a fixed identity.
"""

from __future__ import annotations

import hashlib
import os
import sys

from workloads.kit import (
    Declaration,
    KiB,
    ModelState,
    Params,
    PayloadError,
    check_manifest,
    empty_dirs,
    fsync_path,
    manifest,
    read_file,
    round_bytes,
    round_bytes_ahead,
    scaled_bytes,
    scaled_count,
    stream,
    write_all,
    write_new,
)

TYPE_CHECKING = False  # ``pathlib`` is not imported at run time (``workloads.kit``)
if TYPE_CHECKING:
    from pathlib import Path

    from workloads.kit import Check

GIT_DATE0 = 1704067200  # 2024-01-01T00:00:00Z, first fixture commit
GIT_IDENT = ("Sandbench Fixture", "fixture@sandbench.invalid")
REPO_IGNORE = ("repo/.git/index",)  # stat data of the checkout: differs on every copy
BUILD_IGNORE = ("build/obj/*.o", "build/app")  # compiler output: checked by running the binary
FIXED_MTIME = GIT_DATE0  # sources predate the objects built from them


# ---------------------------------------------------------------- the tools


# fmt: off
def tool_env(root: str) -> dict[str, str]:
    """Environment for git, make and gcc: no user or system config, fixed identity, C locale."""
    name, email = GIT_IDENT
    nowhere = os.path.join(root, ".no-home")  # never created: HOME may be unset or unwritable
    return {
        "PATH": os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin",
        "HOME": nowhere,
        "XDG_CONFIG_HOME": nowhere,
        "LC_ALL": "C",
        "TZ": "UTC",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_AUTHOR_DATE": f"@{GIT_DATE0} +0000",
        "GIT_COMMITTER_DATE": f"@{GIT_DATE0} +0000",
    }


# fmt: on


def run_tool(argv: list[str], cwd: str, root: str, ok: tuple[int, ...] = (0,), **env: str) -> str:
    """Run a tool with captured output (never our stdout); its stdout, or an error.

    ``subprocess`` (with ``re``, ``locale``, ``signal``, ``selectors`` and ``threading``: about
    7 ms here, a quarter of a second in a TCG guest) is imported by the payload before its
    first answer for the workloads that run tools (their ``preload``), so here it is already
    loaded; publish, which runs none, does not load it. Not loaded here means a declaration
    without it, whose first round would time the import: an error, not a slower round."""
    subprocess = sys.modules.get("subprocess")
    if subprocess is None:
        raise PayloadError("subprocess is not loaded: the workload must declare it in preload")

    r = subprocess.run(
        argv,
        cwd=cwd,
        env={**tool_env(root), **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    if r.returncode not in ok:
        err = r.stderr.decode(errors="replace").strip()[-400:]
        raise PayloadError(f"{' '.join(argv[:4])} exited {r.returncode}: {err}")
    out: str = r.stdout.decode(errors="replace")  # the module from sys.modules is untyped
    return out


def tool(argv: list[str], cwd: Path, stdin: bytes | None = None, **env: str) -> None:
    """Run a fixture-building tool with the payload's clean environment; raise on failure."""
    import subprocess

    env = {**tool_env(str(cwd)), **env}
    r = subprocess.run(argv, cwd=cwd, env=env, input=stdin, capture_output=True, check=False)
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip()[-600:]
        raise PayloadError(f"fixture build: {' '.join(argv[:6])} failed in {cwd}: {err}")


# fmt: off
GIT = ["git", "-c", "safe.directory=*", "-c", "core.pager=cat", "-c", "gc.auto=0",
       "-c", "core.fsmonitor=false", "--no-pager"]
# fmt: on


def append_sync(path: str, data: bytes) -> None:
    """Append ``data`` to an existing file, fsync it and its directory."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_path(os.path.dirname(path))


# ---------------------------------------------------------------- repo-inspect


def repo_paths(p: Params) -> list[str]:
    """Tracked file paths of the repo-inspect repository (relative to ``repo/``)."""
    per_dir = -(-p["files"] // p["dirs"])
    return [f"src/m{i // per_dir:02d}/f{i % per_dir:03d}.txt" for i in range(p["files"])]


def commit_subject(i: int) -> str:
    """Subject line of fixture commit number ``i`` (1-based)."""
    return f"commit {i:03d}"


def edited_file(seed: int, k: int, files: int) -> int:
    """Index of the repository file repo-inspect edits in round ``k``."""
    return (seed * 131 + k * 977) % files


def edit_line(seed: int, k: int) -> bytes:
    """The line repo-inspect appends to its edited file in round ``k``."""
    return f"sandbench-edit-{seed} round {k}\n".encode()


def repo_inspect(root: str, seed: int, p: Params, k: int) -> tuple[str, bool]:
    """Edit one tracked file, then run git status, log, grep and diff --stat.

    Clock: the edit and its fsyncs, the four git commands (the work itself) and the comparison
    of their output with the model's expectation.
    """
    repo, rels = os.path.join(root, "repo"), repo_paths(p)
    append_sync(os.path.join(repo, rels[edited_file(seed, k, p["files"])]), edit_line(seed, k))
    edited = sorted({rels[edited_file(seed, j, p["files"])] for j in range(1, k + 1)})
    status = run_tool([*GIT, "status", "--porcelain"], repo, root)
    log = run_tool([*GIT, "log", "--format=%s"], repo, root)
    grep = run_tool([*GIT, "grep", "-l", "-F", f"sandbench-edit-{seed} "], repo, root)
    stat_out = run_tool([*GIT, "diff", "--stat"], repo, root)
    n = len(edited)
    summary = f" {n} file{'s' * (n != 1)} changed, {k} insertion{'s' * (k != 1)}(+)"
    ok = status.splitlines() == [f" M {r}" for r in edited]
    ok = ok and log.splitlines() == [commit_subject(i) for i in range(p["commits"], 0, -1)]
    ok = ok and grep.splitlines() == edited and stat_out.splitlines()[-1:] == [summary]
    return hashlib.sha256((status + log + grep + stat_out).encode()).hexdigest(), ok


def repo_initial(seed: int, i: int, rel: str) -> bytes:
    """Content of tracked file ``i`` in the first commit: a header and 32 seeded text lines."""
    noise = stream(seed, f"repo:{i}", 1024).hex()
    lines = [f"# {rel}"] + [f"{j:02d} {noise[j * 64 : (j + 1) * 64]}" for j in range(32)]
    return ("\n".join(lines) + "\n").encode()


def repo_history(p: Params) -> list[tuple[int, int]]:
    """(commit number, file index) of every commit after the first: one appended line each."""
    return [(c, (c * 37) % p["files"]) for c in range(2, p["commits"] + 1)]


def fast_import_stream(seed: int, p: Params) -> bytes:
    """A git fast-import stream of the whole history, with fixed identity and dates."""
    rels, out = repo_paths(p), []
    contents = [repo_initial(seed, i, rel) for i, rel in enumerate(rels)]
    changes: list[list[int]] = [list(range(len(rels)))] + [[f] for _, f in repo_history(p)]
    name, email = GIT_IDENT
    for c, files in enumerate(changes, start=1):
        when = f"{GIT_DATE0 + c * 60} +0000"
        msg = commit_subject(c).encode() + b"\n"
        out.append(f"commit refs/heads/main\nmark :{c}\n".encode())
        out.append(f"author {name} <{email}> {when}\ncommitter {name} <{email}> {when}\n".encode())
        out.append(b"data %d\n%s" % (len(msg), msg))
        for f in files:
            if c > 1:
                contents[f] += f"history {c}\n".encode()
            out.append(
                b"M 100644 inline %s\ndata %d\n%s\n"
                % (rels[f].encode(), len(contents[f]), contents[f])
            )
    return b"".join(out) + b"done\n"


def build_repo(dest: Path, seed: int, p: Params) -> None:
    """A git repository with fixed commit ids: fast-import, then check out the work tree."""
    repo = dest / "repo"
    repo.mkdir()
    tool([*GIT, "init", "-q", "-b", "main"], repo)
    history = fast_import_stream(seed, p)  # always one pack, whatever the object count:
    tool(
        [*GIT, "-c", "fastimport.unpackLimit=0", "fast-import", "--quiet", "--done"],
        repo,
        history,
    )
    tool([*GIT, "read-tree", "--reset", "-u", "HEAD"], repo)
    import shutil  # the host's alone: the payload never builds a fixture

    for extra in ("hooks", "logs"):  # sample scripts and reflogs: not part of the workload
        shutil.rmtree(repo / ".git" / extra, ignore_errors=True)


def evolve_repo(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Round k appended its edit line to one tracked file."""
    rels, edits = repo_paths(p), dict[str, bytes]()
    for k in range(1, rounds + 1):
        rel = "repo/" + rels[edited_file(seed, k, p["files"])]
        edits[rel] = edits.get(rel, s.read_fixture(rel)) + edit_line(seed, k)
    for rel, data in edits.items():
        s.put(rel, data)


# ---------------------------------------------------------------- incremental-build


def unit_initial(seed: int, unit: int) -> int:
    """The value unit ``unit`` of the C project has in the fixture."""
    return 1000 + (seed % 97) * 100 + unit


def unit_edit(seed: int, k: int, units: int) -> tuple[int, int]:
    """The unit incremental-build edits in round ``k`` and the value it sets."""
    return (k - 1) % units, 100000 + (seed % 9973) * 10 + k


def set_unit_value(source: bytes, value: int) -> bytes:
    """The C source with its ``#define UNIT_VALUE`` line set to ``value``."""
    head, sep, tail = source.partition(b"#define UNIT_VALUE ")
    if not sep:
        raise PayloadError("unit source lacks '#define UNIT_VALUE'")
    _, nl, rest = tail.partition(b"\n")
    return head + sep + str(value).encode() + nl + rest


def incremental_build(root: str, seed: int, p: Params, k: int) -> Check:
    """Edit one translation unit, make -jN, fsync what the build wrote.

    Clock: the edit, make (compile and link) and the fsyncs. After it, the check runs the
    built binary: its printed values must show every edit so far (they decide ``validated``).
    """
    proj = os.path.join(root, "build")
    unit, value = unit_edit(seed, k, p["units"])
    src = os.path.join(proj, "src", f"u{unit:02d}.c")
    data = set_unit_value(read_file(src), value)
    fd = os.open(src, os.O_WRONLY | os.O_TRUNC)
    try:
        write_all(fd, data)
        _newer_than(fd, os.path.join(proj, "obj", f"u{unit:02d}.o"))
        os.fsync(fd)
    finally:
        os.close(fd)
    run_tool(["make", f"-j{p['jobs']}", "-s"], proj, root, TMPDIR=os.path.join(proj, "obj"))
    for rel in (f"obj/u{unit:02d}.o", "app", "obj", "src", "."):
        fsync_path(os.path.join(proj, rel))
    return lambda: run_binary(proj, root, seed, p, k)


def run_binary(proj: str, root: str, seed: int, p: Params, k: int) -> tuple[str, bool]:
    """Run the built binary; its output's digest and whether it prints every unit's value."""
    out = run_tool(["./app"], proj, root)
    values = {u: unit_initial(seed, u) for u in range(p["units"])}
    for j in range(1, k + 1):
        u, v = unit_edit(seed, j, p["units"])
        values[u] = v
    want = [f"unit {u:02d} value {v}" for u, v in sorted(values.items())]
    return hashlib.sha256(out.encode()).hexdigest(), out.splitlines()[: p["units"]] == want


def _newer_than(fd: int, target: str) -> None:
    """Make the file ``fd`` strictly newer than ``target``, as make needs to see the edit.

    File times have the kernel's coarse clock granularity: an edit right after the previous
    round's build could otherwise carry the very same time as the object.
    """
    mtime, other = os.fstat(fd).st_mtime_ns, os.stat(target).st_mtime_ns
    if mtime <= other:
        os.utime(fd, ns=(other + MTIME_STEP_NS, other + MTIME_STEP_NS))


MTIME_STEP_NS = 1_000_000  # 1 ms: above every file system's time granularity we run on


def unit_source(seed: int, u: int) -> str:
    """C source of unit ``u``: a seeded table, a few mixing functions, its value."""
    table = stream(seed, f"unit:{u}", 256)
    words = ", ".join(
        f"0x{int.from_bytes(table[i : i + 4], 'little'):08x}u" for i in range(0, 256, 4)
    )
    fns = "\n".join(
        f"static unsigned mix{u:02d}_{j}(unsigned x)\n{{\n"
        f"    for (int i = 0; i < {8 + j}; i++)\n"
        f"        x = (x ^ table{u:02d}[(x + i * {j + 1}) & 63]) * 0x{0x9E3779B1 + j * 2:08x}u"
        f" + (x >> {j % 13 + 3});\n    return x;\n}}\n"
        for j in range(12)
    )
    chain = "".join(f"    acc = mix{u:02d}_{j}(acc + {j});\n" for j in range(12))
    return (
        f"/* u{u:02d}.c: unit {u} of the sandbench incremental-build project (generated) */\n"
        f'#include "common.h"\n\n#define UNIT_VALUE {unit_initial(seed, u)}\n\n'
        f"static const unsigned table{u:02d}[64] = {{{words}}};\n\n{fns}\n"
        f"int unit{u:02d}_value(void)\n{{\n    return UNIT_VALUE;\n}}\n\n"
        f"unsigned unit{u:02d}_work(unsigned acc)\n{{\n{chain}    return acc;\n}}\n"
    )


def project_files(seed: int, p: Params) -> dict[str, str]:
    """Every source file of the C project, relative to ``build/``."""
    units = [f"u{u:02d}" for u in range(p["units"])]
    header = "".join(
        f"int unit{u:02d}_value(void);\nunsigned unit{u:02d}_work(unsigned);\n"
        for u in range(p["units"])
    )
    calls = "".join(
        f'    printf("unit {u:02d} value %d\\n", unit{u:02d}_value());\n'
        f"    acc = unit{u:02d}_work(acc);\n"
        for u in range(p["units"])
    )
    files = {f"src/{n}.c": unit_source(seed, u) for u, n in enumerate(units)}
    files["src/common.h"] = f"#ifndef COMMON_H\n#define COMMON_H\n{header}#endif\n"
    files["src/main.c"] = (
        '#include <stdio.h>\n#include "common.h"\n\nint main(void)\n{\n    unsigned acc = 1;\n'
        f'{calls}    printf("work %08x\\n", acc);\n    return 0;\n}}\n'
    )
    files["Makefile"] = (
        "CC = /usr/bin/gcc\nCFLAGS = -O2 -pipe -Wall -Isrc\n"
        f"OBJS = {' '.join(f'obj/{n}.o' for n in units)} obj/main.o\n\n"
        "app: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n\n"
        "obj/%.o: src/%.c src/common.h\n\t$(CC) $(CFLAGS) -c -o $@ $<\n"
    )
    return files


def build_project(dest: Path, seed: int, p: Params) -> None:
    """The C project with its objects and binary built, sources older than the objects."""
    proj = dest / "build"
    (proj / "src").mkdir(parents=True)
    (proj / "obj").mkdir()
    for rel, text in project_files(seed, p).items():
        (proj / rel).write_text(text)
        os.utime(proj / rel, (FIXED_MTIME, FIXED_MTIME))
    tool(["make", f"-j{p['jobs']}", "-s"], proj, TMPDIR=str(proj / "obj"))


def evolve_project(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """The edited units carry the value of their last edit."""
    last: dict[int, int] = {}
    for k in range(1, rounds + 1):
        u, value = unit_edit(seed, k, p["units"])
        last[u] = value
    for u, value in last.items():
        rel = f"build/src/u{u:02d}.c"
        s.put(rel, set_unit_value(s.read_fixture(rel), value))


# ---------------------------------------------------------------- publish


def publish(root: str, seed: int, p: Params, k: int) -> Check:
    """Publish a new directory of files with a SHA-256 manifest, fsync files and directories.

    Clock: hashing the files for the manifest, writing and fsyncing every file and both
    directories. After it: every file is read back and checked against the manifest.
    """
    dest = os.path.join(root, "pub", f"release-{k:02d}")
    os.mkdir(dest)
    entries = publish_entries(seed, k, p)
    for name, content in entries:
        write_new(os.path.join(dest, name), content)
    write_new(os.path.join(dest, "MANIFEST.sha256"), manifest(entries))
    fsync_path(dest)
    fsync_path(os.path.dirname(dest))
    return lambda: check_manifest(dest, os.path.join(dest, "MANIFEST.sha256"))


def publish_entries(seed: int, k: int, p: Params) -> list[tuple[str, bytes]]:
    """The (name, content) pairs publish writes in round ``k``."""
    size, n = p["file_bytes"], p["files"]
    data = round_bytes(seed, "publish", k, size * n)
    return [(f"part-{i:03d}.bin", data[i * size : (i + 1) * size]) for i in range(n)]


def evolve_publish(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Round k published pub/release-k with its manifest."""
    for k in range(1, rounds + 1):
        dest = f"pub/release-{k:02d}"
        s.mkdirs(dest)
        entries = publish_entries(seed, k, p)
        for name, data in entries:
            s.put(f"{dest}/{name}", data)
        s.put(f"{dest}/MANIFEST.sha256", manifest(entries))


# ---------------------------------------------------------------- the declarations

# fmt: off
DECLARED = (
    Declaration(
        17, "repo-inspect", "workflow", "workflows",
        "git status, log, grep, diff --stat on a 2,048-file, 200-commit repository after an edit",
        {"files": scaled_count(2048), "dirs": scaled_count(32, at_most="files"),
         "commits": scaled_count(200)},
        repo_inspect, build_repo, evolve_repo, ignore=REPO_IGNORE,
        resources=("cpu", "read", "metadata", "fsync"), preload=("subprocess",),
    ),
    Declaration(
        18, "incremental-build", "workflow", "workflows",
        "edit one unit of a 64-unit C project, make -j2, run the binary, check the edit shows",
        {"units": scaled_count(64), "jobs": 2},
        incremental_build, build_project, evolve_project, ignore=BUILD_IGNORE,
        resources=("cpu", "read", "metadata", "fsync"), preload=("subprocess",),
    ),
    Declaration(
        19, "publish", "workflow", "workflows",
        "new directory with 256 x 16 KiB files and a SHA-256 manifest, fsync files and dirs",
        {"files": scaled_count(256), "file_bytes": scaled_bytes(16 * KiB)},
        publish, empty_dirs("pub"), evolve_publish, seeded_fixture=False,
        inputs=round_bytes_ahead("publish", lambda p: p["file_bytes"] * p["files"]),
        resources=("cpu", "read", "metadata", "fsync"),
    ),
)
# fmt: on
