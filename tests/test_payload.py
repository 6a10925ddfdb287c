"""The payload as a real subprocess: every workload, the protocol, its bootstrap and errors."""

from __future__ import annotations

import ast
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require, require_binary
from workloads import fixtures, kit, oracle
from workloads.drive import PAYLOAD, PAYLOAD_PYTHON, drive, native_environment, payload_argv
from workloads.protocol import Session
from workloads.registry import WORKLOADS

SEED = 11
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fixture cache private to this module."""
    return tmp_path_factory.mktemp("fixtures")


def check_environment(name: str, scale: float, cache: Path, work: Path) -> None:
    """Run 3 rounds natively and require every round validated and the oracle empty."""
    run = native_environment(name, SEED, scale, 3, cache, work / "ws")
    done = [m for m in run.drive.lines if m.get("op") == "done"]
    checked = [m for m in run.drive.lines if m.get("op") == "checked"]
    assert run.drive.lines[0] == {"op": "ready"}, run.drive.lines
    assert [m["k"] for m in done] == [1, 2, 3], (run.drive.lines, run.drive.stderr)
    assert [m["k"] for m in checked] == [0, 1, 2, 3], run.drive.lines
    assert all(m["validated"] for m in checked), run.drive.lines
    assert all(len(m["digest"]) == 64 for m in checked[1:])
    assert run.drive.exit_code == 0, run.drive.stderr
    assert run.mismatches == []


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_small_scale(name: str, cache: Path, tmp_path: Path) -> None:
    """At scale 0.02 each workload validates 3 rounds and its final state matches the oracle."""
    check_environment(name, 0.02, cache, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_full_scale(name: str, cache: Path, tmp_path: Path) -> None:
    """At scale 1.0 each workload validates 3 rounds and its final state matches the oracle."""
    check_environment(name, 1.0, cache, tmp_path)


def workspace(name: str, cache: Path, tmp_path: Path) -> Path:
    """A fresh workspace of ``name`` at scale 0.02."""
    ws = tmp_path / "ws"
    fixtures.copy_fixture(fixtures.ensure_fixture(name, SEED, 0.02, cache), ws)
    return ws


def test_round_out_of_order(cache: Path, tmp_path: Path) -> None:
    """Round 3 before round 2 is answered with an error line naming round 3 and a nonzero exit."""
    result = drive("publish", SEED, 0.02, workspace("publish", cache, tmp_path), [1, 3])
    assert [m["op"] for m in result.lines] == ["ready", "checked", "done", "checked", "error"]
    assert result.lines[-1]["k"] == 3 and "expected round 2" in result.lines[-1]["message"]
    assert result.exit_code != 0


def test_unknown_workload(tmp_path: Path) -> None:
    """An unknown workload gets the ready line, then an error line, then a nonzero exit."""
    result = drive("seqwrite", SEED, 0.02, tmp_path, [1])
    assert result.lines[0] == {"op": "ready"}
    assert result.lines[1]["op"] == "error" and "seqwrite" in result.lines[1]["message"]
    assert result.exit_code != 0


def run_raw(
    argv: list[str], stdin: str, env: dict[str, str] | None = None
) -> tuple[list[str], int]:
    """Run the payload with ``stdin``; its stdout lines and exit status."""
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, timeout=120)
    return r.stdout.splitlines(), r.returncode


@pytest.mark.parametrize(
    "args",
    [
        ["--workload", "publish", "--seed", "x", "--scale", "0.02"],
        ["--workload", "publish", "--seed", "1", "--scale", "0.02", "--root", "/nonexistent"],
        ["--workload", "publish", "--seed", "1", "--scale", "7", "--root", "/tmp"],
        ["--bogus"],
    ],
)
def test_bad_arguments(args: list[str]) -> None:
    """Bad arguments are answered with ready, one error line and a nonzero exit."""
    lines, code = run_raw(["/usr/bin/python3", "-I", "-S", str(PAYLOAD), *args], "")
    assert json.loads(lines[0]) == {"op": "ready"}
    assert json.loads(lines[1])["op"] == "error" and len(lines) == 2
    assert code != 0


def test_round_beyond_prepared(cache: Path, tmp_path: Path) -> None:
    """A round past MAX_ROUNDS is an error that says how many rounds fixtures prepare."""
    ws = workspace("seq-write", cache, tmp_path)
    rounds = list(range(1, kit.MAX_ROUNDS + 2))
    result = drive("seq-write", SEED, 0.02, ws, rounds)
    assert result.lines[-1]["op"] == "error" and str(kit.MAX_ROUNDS) in result.lines[-1]["message"]
    assert result.exit_code != 0


def test_unknown_request_and_eof(cache: Path, tmp_path: Path) -> None:
    """An unknown request and a closed stdin are errors, never a silent exit 0."""
    argv = payload_argv("publish", SEED, 0.02, workspace("publish", cache, tmp_path))
    lines, code = run_raw(argv, '{"op": "dance"}\n')
    assert json.loads(lines[-1])["op"] == "error" and code != 0
    lines, code = run_raw(argv, "")
    assert json.loads(lines[-1])["message"].endswith("stdin closed before exit") and code != 0


@pytest.mark.parametrize("name", ["repo-inspect", "incremental-build"])
def test_tools_without_home(name: str, cache: Path, tmp_path: Path) -> None:
    """git, make and gcc rounds work with HOME unset and only the protocol on stdout."""
    argv = payload_argv(name, SEED, 0.02, workspace(name, cache, tmp_path))
    stdin = "".join(
        json.dumps(m) + "\n"
        for m in ({"op": "round", "k": 1}, {"op": "check", "k": 1}, {"op": "round", "k": 2},
                  {"op": "check", "k": 2}, {"op": "exit"})
    )  # fmt: skip
    lines, code = run_raw(argv, stdin, env={"PATH": "/usr/bin:/bin"})
    answers = [json.loads(line) for line in lines]
    assert [a["op"] for a in answers] == ["ready", "done", "checked", "done", "checked"]
    assert code == 0 and all(a["validated"] for a in answers if a["op"] == "checked")


def test_import_has_no_side_effects() -> None:
    """Importing the payload's files on the host writes nothing and reads no stdin."""
    code = "import workloads.payload, workloads.protocol as p; assert p.find_declared('publish')"
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        input="",
        capture_output=True,
        text=True,
        check=False,
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def payload_copy(tmp_path: Path) -> Path:
    """A copy of the payload's directory (no bytecode) and the bootstrap in it."""
    copy = tmp_path / "copy" / "workloads"
    shutil.copytree(PAYLOAD.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy / "payload.py"


def test_ready_comes_before_the_body_is_compiled(tmp_path: Path) -> None:
    """The ready line is written before the body is read: a body that does not compile
    still gets ready out first, then the launcher fails naming the error."""
    bootstrap = payload_copy(tmp_path)
    (bootstrap.parent / "protocol.py").write_text("def broken(:\n")
    argv = [PAYLOAD_PYTHON, "-I", "-S", str(bootstrap), "--workload", "publish"]
    r = subprocess.run(argv, input="", capture_output=True, text=True, timeout=60, check=False)
    assert r.stdout.splitlines() == ['{"op": "ready"}'] and r.returncode != 0
    assert "SyntaxError" in r.stderr


def test_the_bootstrap_is_tiny() -> None:
    """The launched file imports only sys, and its first statement after that writes Ready."""
    tree = ast.parse(PAYLOAD.read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert [ast.unparse(n) for n in imports] == [
        "import sys", "from workloads.protocol import main"
    ]  # fmt: skip
    guard = next(n for n in tree.body if isinstance(n, ast.If))
    assert "ready" in ast.unparse(guard.body[0]) and len(PAYLOAD.read_text().splitlines()) < 25


def test_no_bytecode_anywhere(cache: Path, tmp_path: Path) -> None:
    """A payload run leaves no __pycache__ beside the payload nor in the workspace."""
    bootstrap = payload_copy(tmp_path)
    ws = workspace("incremental-build", cache, tmp_path)
    result = drive("incremental-build", SEED, 0.02, ws, [1, 2], payload=bootstrap)
    assert result.ok, (result.lines, result.stderr)
    assert not list(bootstrap.parent.rglob("__pycache__"))
    assert not list(ws.rglob("__pycache__")) and not list(ws.rglob("*.pyc"))


def test_the_environment_side_needs_only_the_standard_library() -> None:
    """The bootstrap, its body and every workload module the catalog lists import only the
    standard library and each other: all of it runs inside every mode."""
    from workloads import catalog

    inside = {"payload", "protocol", "jsonline", "catalog", "kit", "calibration"}
    inside |= {module.__name__.rpartition(".")[2] for module in catalog.MODULES}
    for name in inside:
        tree = ast.parse((PAYLOAD.parent / f"{name}.py").read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                names = [f"{base}.{a.name}" if base == "workloads" else base for a in node.names]
            for full in names:
                top, _, sub = full.partition(".")
                if top == "workloads":
                    assert sub.partition(".")[0] in inside, (name, full)
                else:
                    assert top in sys.stdlib_module_names or top == "__future__", (name, full)


def test_repeated_edit_rebuilds(cache: Path, tmp_path: Path) -> None:
    """With one unit every round re-edits it, and each rebuilt binary shows the new value."""
    assert WORKLOADS["incremental-build"].params(0.01)["units"] == 1
    ws = tmp_path / "ws"
    fixtures.copy_fixture(fixtures.ensure_fixture("incremental-build", SEED, 0.01, cache), ws)
    result = drive("incremental-build", SEED, 0.01, ws, list(range(1, 6)))
    # ready, checked 0, then done and checked for each of the 5 rounds
    assert result.ok and len(result.lines) == 12, result.lines


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_on_overlayfs(name: str, cache: Path, tmp_path: Path) -> None:
    """Each workload also passes with its workspace on overlayfs, leaving the lower layer intact."""
    require(os.geteuid() == 0, "root, to mount overlayfs")
    fixture = fixtures.ensure_fixture(name, SEED, 0.02, cache)
    lower, upper, work, merged = (tmp_path / d for d in ("lower", "upper", "work", "merged"))
    fixtures.copy_fixture(fixture, lower)
    for d in (upper, work, merged):
        d.mkdir()
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)], check=True)
    try:
        result = drive(name, SEED, 0.02, merged, [1, 2, 3])
        model = WORKLOADS[name].model(SEED, 0.02, 3, fixture=fixture)
        assert result.ok, (result.lines, result.stderr)
        assert oracle.compare(merged, model) == []
    finally:
        subprocess.run(["umount", str(merged)], check=True)
    ignore = WORKLOADS[name].ignore
    assert fixtures.tree_digest(lower, ignore) == fixtures.tree_digest(fixture, ignore)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_writes_only_under_root(name: str, cache: Path, tmp_path: Path) -> None:
    """Each workload passes in a bubblewrap sandbox whose only writable path is its root."""
    bwrap = require_binary("bwrap")
    ws = workspace(name, cache, tmp_path)
    sandbox = (bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
               "--bind", str(ws), str(ws), "--unshare-net", "--die-with-parent", "--")  # fmt: skip
    result = drive(name, SEED, 0.02, ws, [1, 2, 3], sandbox)
    assert result.ok, (result.lines, result.stderr)
    model = WORKLOADS[name].model(
        SEED, 0.02, 3, fixture=fixtures.ensure_fixture(name, SEED, 0.02, cache)
    )
    assert oracle.compare(ws, model) == []


@pytest.mark.parametrize("last", [False, True])
def test_the_last_check_prepares_no_round_after_it(last: bool, cache: Path, tmp_path: Path) -> None:
    """``check k`` makes round k+1's inputs (the working-set schedule, seeded bytes) unless the
    host says no round follows (``next: false``, the last round's check): the payload's own
    session, in this process, on a real workspace; the values made ahead are what it kept."""
    argv = payload_argv("ws64-w1", SEED, 0.02, workspace("ws64-w1", cache, tmp_path))
    requests = [{"op": "check", "k": 0}, {"op": "round", "k": 1},
                {"op": "check", "k": 1, "next": not last}, {"op": "exit"}]  # fmt: skip
    answers = io.StringIO()
    kit.forget_prepared()
    try:
        code = Session(answers).serve(argv[argv.index("--workload"):],
                                      [json.dumps(m) for m in requests])  # fmt: skip
        made = dict(kit._AHEAD)  # what the session made ahead: the observable
    finally:
        kit.forget_prepared()
    lines = [json.loads(line) for line in answers.getvalue().splitlines()]
    assert code == 0 and [m["op"] for m in lines] == ["checked", "done", "checked"], lines
    assert all(m["validated"] for m in lines if m["op"] == "checked"), lines
    schedules = {key[2] for key in made if key[0] == "ws-schedule"}
    assert schedules == (set() if last else {2}), sorted(map(str, made))


def test_the_working_set_check_sees_a_wrong_block(cache: Path, tmp_path: Path) -> None:
    """The read-back check after a working-set round compares what it reads with the round's
    last write of each sampled block: one flipped byte in block 0 (always sampled) fails it."""
    from workloads import working_set

    ws = workspace("ws64-w1", cache, tmp_path)
    p = WORKLOADS["ws64-w1"].scaled(0.02)
    check = working_set.working_set(str(ws), SEED, p, 1)
    assert callable(check) and check()[1] is True
    path = working_set.ws_paths(str(ws), p)[0]
    with open(path, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
    assert check()[1] is False
