"""No traceback for any input: generated plan files and damaged campaign directories.

Plans with every key of a plan given wrong types, extreme numbers, unicode or random bytes go
through ``plan show`` and ``run`` (whose work root is a file, so even a valid plan is refused
before anything runs); one real small campaign, made once per module, is damaged one file at a
time (truncated, emptied, not JSON, JSON of the wrong shape, made a directory) and goes through
``verify``, ``report`` and ``compare``. Each command must exit 2 with one line of error (1 for a
verify finding, 0 where the input is valid), print no traceback, and change no file but those
it writes. ``benchmarks/fuzz_inputs.py`` runs the same properties with many more examples.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
# CI's examples per property (the file stays under 3 min): a plan example is two subprocesses
# (~1 s each on a busy 2-core machine), a campaign example one
PLAN_EXAMPLES = 40
CAMPAIGN_EXAMPLES = 60
TIMEOUT_S = 120
HOST = "lab-fuzz"
PLAN = """
name = "fuzz"
seed = 5
scale = 0.02
environments = 2
rounds = 1
workloads = ["publish"]
modes = ["native"]
sentinel = false
"""

# ---------------------------------------------------------------- plan files

PLAN_KEYS = ("name", "cohort", "seed", "environments", "rounds", "limit_s", "scale",
             "workloads", "modes", "quota", "vm", "notes", "sentinel")  # fmt: skip
MODE_KEYS = ("name", "template", "staged", "root", "result_root", "prepare", "sync",
             "collect", "cleanup", "workloads", "options")  # fmt: skip
NAMES = ("native", "staged", "docker", "vm", "gvisor", "nsjail", "all", "publish", "seq-write",
         "mechanism", "resource", "workflow", "", "..", "../x", "a/b", "x" * 300)  # fmt: skip

extreme_ints = st.one_of(
    st.integers(-3, 5), st.sampled_from([2**31, 2**63, -(2**63), 10**30, 0]), st.integers()
)
extreme_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-320, 1e308]),
    st.floats(0.001, 1.0),
)
texts = st.one_of(st.text(max_size=30), st.sampled_from(NAMES))
scalars = st.one_of(st.booleans(), extreme_ints, extreme_floats, texts)
wild = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=8,
)


def near_right(key: str) -> st.SearchStrategy[Any]:
    """Values of the right shape for plan key ``key`` (to get past the first checks)."""
    names = st.lists(texts, max_size=4)
    mode_table = st.fixed_dictionaries(
        {"name": texts}, optional={k: st.one_of(names, texts, wild) for k in MODE_KEYS[1:]}
    )
    shaped: dict[str, st.SearchStrategy[Any]] = {
        "seed": extreme_ints, "environments": extreme_ints, "rounds": extreme_ints,
        "limit_s": extreme_floats, "scale": extreme_floats,
        "workloads": names, "notes": names,
        "modes": st.lists(st.one_of(texts, mode_table), max_size=3),
        "quota": st.fixed_dictionaries({}, optional={
            "cpus": st.one_of(texts, st.sampled_from(["0", "0-100000", "0,,1", "1-0"])),
            "cpu_quota": extreme_floats, "memory": st.one_of(texts, st.sampled_from(
                ["2GiB", "0", "-1GiB", "1e99GiB", "9" * 40])), "swap": texts}),
        "vm": st.fixed_dictionaries({}, optional={"vcpus": extreme_ints,
                                                   "memory_mib": extreme_ints}),
        "sentinel": st.one_of(st.booleans(), st.fixed_dictionaries({"every": extreme_ints})),
    }  # fmt: skip
    return shaped.get(key, texts)


VALID_PLAN: dict[str, Any] = {"name": "fuzz", "seed": 1, "environments": 2, "rounds": 1,
                              "scale": 0.02, "workloads": ["publish"], "modes": ["native"],
                              "sentinel": False}  # fmt: skip


@st.composite
def plan_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A plan as a dict: a valid plan with a few keys changed or dropped, or keys drawn afresh
    (some near right, some wild), sometimes with a key no plan has."""
    valid_base = draw(st.booleans())
    plan: dict[str, Any] = dict(VALID_PLAN) if valid_base else {}
    changes = st.lists(st.sampled_from(PLAN_KEYS), unique=True, max_size=3 if valid_base else 13)
    for key in draw(changes):
        if valid_base and draw(st.integers(0, 4)) == 0:
            plan.pop(key, None)
        else:
            plan[key] = draw(st.one_of(near_right(key), near_right(key), wild))
    if draw(st.booleans()) and draw(st.booleans()):
        plan[draw(texts)] = draw(wild)
    return plan


def toml_key(key: str) -> str:
    """``key`` as a TOML key (quoted unless bare)."""
    bare = key and all(c.isascii() and (c.isalnum() or c in "-_") for c in key)
    return key if bare else json.dumps(key, ensure_ascii=False)


def toml_value(value: Any) -> str:
    """``value`` as TOML (inline tables; NaN and infinities as TOML spells them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        items = ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)


def toml_text(plan: dict[str, Any]) -> str:
    """A plan dict as a TOML document."""
    return "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in plan.items())


plan_files = st.one_of(
    plan_documents().map(lambda p: toml_text(p).encode()),
    plan_documents().map(lambda p: toml_text(p).encode()),
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    plan_documents().map(lambda p: toml_text(p).encode()[: len(toml_text(p)) // 2]),
)

# ---------------------------------------------------------------- running commands


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and directory (None) under ``root`` by relative path."""
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = None if p.is_dir() and not p.is_symlink() else p.read_bytes()
    return out


def changed(before: dict[str, bytes | None], after: dict[str, bytes | None]) -> set[str]:
    """Paths made, removed or changed between two snapshots."""
    return {k for k in before.keys() | after.keys() if before.get(k, b"?") != after.get(k, b"?")}


Runner = Callable[..., subprocess.CompletedProcess[str]]


def sandbench(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m coordinator ARGS`` with ``home`` as SANDBENCH_HOME."""
    env = {**os.environ, "SANDBENCH_HOME": str(home), "COLUMNS": "160"}
    return subprocess.run([sys.executable, "-m", "coordinator", *args], capture_output=True,
                          text=True, timeout=TIMEOUT_S, env=env, cwd=REPO)  # fmt: skip


def outcome_problem(
    what: str, out: subprocess.CompletedProcess[str], codes: set[int]
) -> str | None:
    """What is wrong with a command's outcome: exit code, traceback, a long error; else None."""
    text = out.stdout + out.stderr
    err = out.stderr.strip().splitlines()
    if "Traceback" in text or out.returncode not in codes:
        last = (err or ["(no output)"])[-1]
        return f"{what}: exit {out.returncode}: {last}"
    if out.returncode == 2 and len(err) != 1:
        return f"{what}: exit 2 with {len(err)} lines of error: {out.stderr[:300]!r}"
    return None


def plan_problem(root: Path, content: bytes, runner: Runner = sandbench) -> str | None:
    """Run one plan file through ``plan show`` and ``run``; the first problem, else None."""
    home, data, plan = root / "home", root / "data", root / "plan.toml"
    home.mkdir(exist_ok=True)
    work_root = root / "not-a-dir"
    work_root.write_bytes(b"")
    plan.write_bytes(content)
    before = snapshot(root)
    shown = runner(home, "plan", "show", str(plan))
    problem = outcome_problem("plan show", shown, {0, 2})
    if problem is None:
        run = runner(home, "run", str(plan), "--data", str(data), "--work-root",
                        str(work_root), "--key", str(home / "host.key"), "--host-name", HOST,
                        "--registry", str(home / "hosts.json"), "--no-progress")  # fmt: skip
        problem = outcome_problem("run", run, {2})
    if problem is None and (made := changed(before, snapshot(root))):
        problem = f"files changed: {sorted(made)}"
    return None if problem is None else f"{problem}\n--- plan file: {content[:400]!r}"


# ---------------------------------------------------------------- damaged campaigns


@dataclass(frozen=True)
class Lab:
    """A stored campaign made once: its data directory, key home and id."""

    root: Path
    campaign: str

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def files(self) -> list[str]:
        """Every file of the campaign directory, relative to it, sorted."""
        cdir = self.data / self.campaign
        return sorted(str(p.relative_to(cdir)) for p in cdir.rglob("*") if p.is_file())


def make_lab(root: Path) -> Lab:
    """Run one small embedded campaign (native, tiny scale) under ``root``."""
    home = root / "home"
    root.mkdir(parents=True, exist_ok=True)
    (root / "plan.toml").write_text(PLAN)
    out = sandbench(home, "run", str(root / "plan.toml"), "--data", str(root / "data"),
                    "--work-root", str(root / "work"), "--key", str(home / "host.key"),
                    "--host-name", HOST, "--registry", str(home / "hosts.json"),
                    "--no-progress")  # fmt: skip
    assert out.returncode == 0 and "records: verified" in out.stdout, out.stdout + out.stderr
    return Lab(root, out.stdout.strip().splitlines()[-1].removeprefix("campaign: "))


WRONG_SHAPES = (b"[]", b"{}", b"null", b"1", b'"x"', b'{"hosts": 1}', b"[[1, 2]]",
                b'{"campaign": null, "specs": "x"}', b"true\n")  # fmt: skip
DAMAGES = ("truncate", "empty", "not-json", "wrong-shape", "directory")
COMMANDS = ("verify", "report", "compare")
# What each command writes in the campaign directory (a damaged one of these is rewritten).
WRITES: dict[str, Callable[[str], bool]] = {
    "verify": lambda rel: rel == "verification.json",
    "report": lambda rel: (
        rel in ("report.md", "report.html")
        or rel.startswith("plots")
        or rel.endswith("results.csv")
    ),
    "compare": lambda rel: False,
}


@dataclass(frozen=True)
class Damage:
    """One damage to one file of the campaign, and the command run on the result."""

    index: int  # into the campaign's sorted file list (modulo its length)
    kind: str
    cut: float  # where a truncation cuts, as a fraction of the file
    junk: bytes  # what replaces the file when it becomes not-JSON
    shape: bytes  # what replaces it when it becomes JSON of the wrong shape
    command: str


damages = st.builds(
    Damage,
    index=st.integers(0, 10_000),
    kind=st.sampled_from(DAMAGES),
    cut=st.floats(0.0, 1.0),
    junk=st.one_of(st.binary(min_size=1, max_size=64), st.just(b"{not json")),
    shape=st.sampled_from(WRONG_SHAPES),
    command=st.sampled_from(COMMANDS),
)


def damage_file(path: Path, d: Damage) -> None:
    """Apply ``d`` to the file at ``path``."""
    content = path.read_bytes()
    if d.kind == "truncate":
        path.write_bytes(content[: int(len(content) * d.cut)])
    elif d.kind == "empty":
        path.write_bytes(b"")
    elif d.kind == "not-json":
        path.write_bytes(d.junk + b"\n" + content[:10])
    elif d.kind == "wrong-shape":
        path.write_bytes(d.shape)
    else:
        path.unlink()
        path.mkdir()


def command_args(lab: Lab, data: Path, command: str) -> list[str]:
    """The command line of ``command`` on the damaged copy."""
    registry = ["--data", str(data), "--registry", str(lab.home / "hosts.json")]
    if command == "compare":
        return ["compare", lab.campaign, lab.campaign, *registry]
    return [command, lab.campaign, *registry, *(["--quiet"] if command == "report" else [])]


def campaign_problem(lab: Lab, scratch: Path, d: Damage, runner: Runner = sandbench) -> str | None:
    """Damage one file of a copy of ``lab``'s campaign and run one command; the problem or None."""
    data = scratch / "data"
    shutil.copytree(lab.data / lab.campaign, data / lab.campaign, symlinks=True)
    files = lab.files()
    rel = files[d.index % len(files)]
    damage_file(data / lab.campaign / rel, d)
    before = snapshot(data / lab.campaign)
    home_before = snapshot(lab.home)
    out = runner(lab.home, *command_args(lab, data, d.command))
    codes = {0, 1, 2} if d.command == "verify" else {0, 2}
    problem = outcome_problem(d.command, out, codes)
    writes = WRITES[d.command]
    made = {p for p in changed(before, snapshot(data / lab.campaign)) if not writes(p)}
    made |= {f"home/{p}" for p in changed(home_before, snapshot(lab.home)) if p != "hosts.lock"}
    if problem is None and made:
        problem = f"{d.command}: files changed: {sorted(made)}"
    return None if problem is None else f"{problem}\n--- {d.kind} of {rel} ({d})"


# ---------------------------------------------------------------- the properties


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    """One real small campaign, made once for the module."""
    return make_lab(tmp_path_factory.mktemp("fuzz-lab"))


def fuzz(examples: int) -> Any:
    """Hypothesis settings for a property of ``examples`` subprocess-bound examples."""
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])  # fmt: skip


@fuzz(PLAN_EXAMPLES)
@given(content=plan_files)
@example(content=b'modes = [""]\n')  # found by the fuzz (a traceback once)
@example(content='modes = ["sÉ", "native"]\n'.encode())
# found by the 5,000-example run: a key with a form feed or newline split the error line
@example(content=toml_text({**VALID_PLAN, "\f": []}).encode())
@example(content=toml_text({**VALID_PLAN, "a\nb\u001b[31m\u2028": 1}).encode())
def test_no_plan_file_gives_a_traceback(content: bytes) -> None:
    """plan show exits 0 or 2 and run exits 2 for any plan file: one line, nothing written."""
    with tempfile.TemporaryDirectory() as scratch:
        problem = plan_problem(Path(scratch), content)
    assert problem is None, problem


@fuzz(CAMPAIGN_EXAMPLES)
@given(d=damages)
def test_no_damaged_campaign_gives_a_traceback(lab: Lab, d: Damage) -> None:
    """verify, report and compare on a campaign with one damaged file: exit 2 with one line
    (verify 1 for a finding, 0 where nothing it checks was touched), no traceback, and no file
    changed but those the command writes."""
    with tempfile.TemporaryDirectory() as scratch:
        problem = campaign_problem(lab, Path(scratch), d)
    assert problem is None, problem
