"""The 3 workflow workloads on the host side: the git repository, the C project, publish."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tasks.errors import WorkloadError
from workloads import payload as pl
from workloads.base import ModelState

Params = dict[str, int]
REPO_IGNORE = ("repo/.git/index",)  # stat data of the checkout: differs on every copy
BUILD_IGNORE = ("build/obj/*.o", "build/app")  # compiler output: checked by running the binary
FIXED_MTIME = pl.GIT_DATE0  # sources predate the objects built from them


def tool(argv: list[str], cwd: Path, stdin: bytes | None = None, **env: str) -> None:
    """Run a fixture-building tool with the payload's clean environment; raise on failure."""
    env = {**pl.tool_env(str(cwd)), **env}
    r = subprocess.run(argv, cwd=cwd, env=env, input=stdin, capture_output=True, check=False)
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip()[-600:]
        raise WorkloadError(f"fixture build: {' '.join(argv[:6])} failed in {cwd}: {err}")


# ---------------------------------------------------------------- repo-inspect


def repo_initial(seed: int, i: int, rel: str) -> bytes:
    """Content of tracked file ``i`` in the first commit: a header and 32 seeded text lines."""
    noise = pl.stream(seed, f"repo:{i}", 1024).hex()
    lines = [f"# {rel}"] + [f"{j:02d} {noise[j * 64 : (j + 1) * 64]}" for j in range(32)]
    return ("\n".join(lines) + "\n").encode()


def repo_history(p: Params) -> list[tuple[int, int]]:
    """(commit number, file index) of every commit after the first: one appended line each."""
    return [(c, (c * 37) % p["files"]) for c in range(2, p["commits"] + 1)]


def fast_import_stream(seed: int, p: Params) -> bytes:
    """A git fast-import stream of the whole history, with fixed identity and dates."""
    rels, out = pl.repo_paths(p), []
    contents = [repo_initial(seed, i, rel) for i, rel in enumerate(rels)]
    changes: list[list[int]] = [list(range(len(rels)))] + [[f] for _, f in repo_history(p)]
    name, email = pl.GIT_IDENT
    for c, files in enumerate(changes, start=1):
        when = f"{pl.GIT_DATE0 + c * 60} +0000"
        msg = pl.commit_subject(c).encode() + b"\n"
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
    tool([*pl.GIT, "init", "-q", "-b", "main"], repo)
    stream = fast_import_stream(seed, p)  # always one pack, whatever the object count:
    tool(
        [*pl.GIT, "-c", "fastimport.unpackLimit=0", "fast-import", "--quiet", "--done"],
        repo,
        stream,
    )
    tool([*pl.GIT, "read-tree", "--reset", "-u", "HEAD"], repo)
    for extra in ("hooks", "logs"):  # sample scripts and reflogs: not part of the workload
        shutil.rmtree(repo / ".git" / extra, ignore_errors=True)


def evolve_repo(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Round k appended its edit line to one tracked file."""
    rels, edits = pl.repo_paths(p), dict[str, bytes]()
    for k in range(1, rounds + 1):
        rel = "repo/" + rels[pl.edited_file(seed, k, p["files"])]
        edits[rel] = edits.get(rel, s.read_fixture(rel)) + pl.edit_line(seed, k)
    for rel, data in edits.items():
        s.put(rel, data)


# ---------------------------------------------------------------- incremental-build


def unit_source(seed: int, u: int) -> str:
    """C source of unit ``u``: a seeded table, a few mixing functions, its value."""
    table = pl.stream(seed, f"unit:{u}", 256)
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
        f'#include "common.h"\n\n#define UNIT_VALUE {pl.unit_initial(seed, u)}\n\n'
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
        u, value = pl.unit_edit(seed, k, p["units"])
        last[u] = value
    for u, value in last.items():
        rel = f"build/src/u{u:02d}.c"
        s.put(rel, pl.set_unit_value(s.read_fixture(rel), value))


# ---------------------------------------------------------------- publish


def evolve_publish(s: ModelState, seed: int, p: Params, rounds: int) -> None:
    """Round k published pub/release-k with its manifest."""
    for k in range(1, rounds + 1):
        dest = f"pub/release-{k:02d}"
        s.mkdirs(dest)
        entries = pl.publish_entries(seed, k, p)
        for name, data in entries:
            s.put(f"{dest}/{name}", data)
        s.put(f"{dest}/MANIFEST.sha256", pl.manifest(entries))
