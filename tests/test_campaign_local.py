"""`sandbench run` on this machine: the rule, preflight, verify, Ctrl-C and resume."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract.records import NOT_RUN_RULE, SCHEMA_VERSION, NotRun, not_run_kind
from contract.signing import HostKey
from coordinator.results.walltime import LARGEST
from coordinator.store.store import Store
from tests.conftest import files_of
from worker import trash

FAILING_PLAN = """
name = "rule"
seed = 5
scale = 0.02
environments = 3
workloads = ["publish", "seq-write"]
modes = [
  "native",
  { name = "always-fails", template = ["/bin/false"] },
  { name = "absent", template = ["/nonexistent/sandbox-runtime", "{payload_argv}"] },
]
"""
SLOW_PLAN = """
name = "slow"
seed = 2
scale = 0.02
environments = 3
workloads = ["publish"]
sentinel = false  # the first record is then the slow mode's: Ctrl-C lands inside the second
[[modes]]
name = "slow-start"
template = ["/bin/sh", "-c", "sleep 1.5; exec \\"$@\\"", "sh", "{payload_argv}"]
"""
RUN_TIMEOUT_S = 300


class Lab:
    """Paths of one test's private host key, registry, store and work root."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.data, self.work = tmp_path / "data", tmp_path / "work"
        self.key, self.registry = tmp_path / "home" / "host.key", tmp_path / "home" / "hosts.json"

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "coordinator", *args]

    def run_args(self) -> list[str]:
        return ["--data", str(self.data), "--work-root", str(self.work), "--key", str(self.key),
                "--registry", str(self.registry), "--host-name", "lab-test",
                "--no-progress"]  # fmt: skip

    def sandbench(self, *args: str, check: int | None = 0) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            self.argv(*args), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
        if check is not None:
            assert out.returncode == check, out.stdout[-3000:] + out.stderr[-3000:]
        return out

    def plan(self, text: str) -> str:
        path = self.root / "plan.toml"
        path.write_text(text)
        return str(path)


def _campaign_id(stdout: str) -> str:
    last = stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"campaign: (c-\d{8}-[0-9a-f]{4})", last)
    assert m, f"last line is not the campaign id: {last!r}"
    return m.group(1)


def _cells(store: Store, cid: str) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for r in sorted(store.records(cid), key=lambda r: r.order_index):
        out.setdefault((r.mode, r.workload), []).append(
            r.outcome if r.outcome != "not-run" else r.reason or ""
        )
    return out


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    """A private lab: nothing of the machine's own key, registry or store is touched."""
    return Lab(tmp_path)


def test_failing_and_unavailable_modes(lab: Lab) -> None:
    """An always-failing mode: 1 failed + N-1 rule not-runs per cell; an absent one: preflight."""
    out = lab.sandbench("run", lab.plan(FAILING_PLAN), *lab.run_args())
    cid = _campaign_id(out.stdout)
    assert lab.key.exists()  # a newcomer's first run creates the host key
    store = Store(lab.data)
    cells = _cells(store, cid)
    for w in ("publish", "seq-write"):
        assert cells[("native", w)] == ["passed"] * 3
        assert cells[("always-fails", w)] == ["failed", NOT_RUN_RULE, NOT_RUN_RULE]
        assert all(not_run_kind("not-run", r) is NotRun.PREFLIGHT for r in cells[("absent", w)])
        assert len(cells[("absent", w)]) == 3
    csv = (lab.data / cid / "hosts" / "lab-test" / "results.csv").read_text()
    assert ",always-fails,publish,workflow,1,incomplete," in csv
    assert ",absent,publish,workflow,1,preflight-failed,preflight failed: command mode" in csv
    assert "— [" in out.stdout and "not run under the first-failure-rule" in out.stdout
    assert _leftover_environments(lab) == []
    _check_wall_split(out.stdout)
    kept = re.search(r"^trash: (\d+) removed environments' directories kept in (.*) \(", out.stdout,
                     re.MULTILINE)  # fmt: skip
    if trash.defers(lab.work):  # ext4 without a journal (this machine's root): run says so
        assert kept and int(kept.group(1)) == trash.held(lab.work) > 0, out.stdout
        assert kept.group(2) == str(lab.work / trash.TRASH_DIR)
    else:
        assert kept is None and trash.held(lab.work) == 0
    report = (lab.data / cid / "report.md").read_text()
    costs = report.split("### Where the time went", 1)[1].split("###", 1)[0]
    assert "| native / publish | 3 |" in costs and "| all " in costs, costs


def _check_wall_split(stdout: str) -> None:
    """The run's last lines split its wall time into parts that add up to it."""
    line = next(x for x in stdout.splitlines() if x.startswith("wall time "))
    wall = float(re.match(r"wall time ([\d.]+) s:", line).group(1))  # type: ignore[union-attr]
    seconds = [float(s) for s in re.findall(r" ([\d.]+) s \(", line)]
    assert [p.split(" ", 1)[0] for p in line.split(": ", 1)[1].split(", ")][:5] == [
        "measured", "preparation", "oracle", "cleanup", "sentinel"]  # fmt: skip
    assert len(seconds) == 6 and seconds[0] > 0  # five parts and the harness (each rounded)
    assert sum(seconds) == pytest.approx(wall, abs=0.35)  # each figure rounded to 0.1 s
    costs = next(x for x in stdout.splitlines() if x.startswith("largest unmeasured costs: "))
    named = costs.removeprefix("largest unmeasured costs: ").split("; ")
    assert 0 < len(named) <= LARGEST
    cost = re.compile(r"\S+ / \S+ (prepare|drive|oracle|cleanup)\.\w+: [\d.]+ s \([\d.]+%\)")
    assert all(cost.fullmatch(c) for c in named), named


def _leftover_environments(lab: Lab) -> list[Path]:
    """Environment directories still under the work root (fixtures may stay: built once)."""
    envs = lab.work / "envs"
    return list(envs.iterdir()) if envs.exists() else []


def test_verify_passes_then_names_a_changed_record(lab: Lab) -> None:
    """verify passes on an untouched campaign and names the environment after one byte changes."""
    cid = _campaign_id(lab.sandbench("run", lab.plan(FAILING_PLAN), *lab.run_args()).stdout)
    reg = ["--data", str(lab.data), "--registry", str(lab.registry)]
    assert "verified" in lab.sandbench("verify", cid, *reg).stdout
    csv = lab.data / cid / "hosts" / "lab-test" / "results.csv"
    before = csv.read_bytes()
    lab.sandbench("report", cid, "--data", str(lab.data), "--quiet")
    assert csv.read_bytes() == before  # rebuilt from raw records, byte for byte
    path = lab.data / cid / "hosts" / "lab-test" / "records.jsonl"
    original = path.read_bytes()
    lines = original.decode().splitlines(keepends=True)
    n = next(i for i, line in enumerate(lines) if '"outcome":"passed"' in line)
    rec = json.loads(lines[n])
    key = f"{cid}/lab-test/{rec['mode']}/{rec['workload']}/{rec['env_index']}/1"
    pos = lines[n].index('"ready_ms":') + len('"ready_ms":')
    digit = lines[n][pos]
    lines[n] = lines[n][:pos] + ("1" if digit != "1" else "2") + lines[n][pos + 1 :]
    path.write_text("".join(lines))
    out = lab.sandbench("verify", cid, *reg, check=1)
    assert f"{key}: bad signature" in out.stdout and "UNVERIFIED" in out.stdout
    assert Store(lab.data).verification(cid)["ok"] is False  # type: ignore[index]
    lab.sandbench("report", cid, "--data", str(lab.data), "--quiet")
    assert "UNVERIFIED" in (lab.data / cid / "report.md").read_text()
    broken = original.replace(b'"outcome":"passed"', b'"outcome":"passeD"', 1)
    path.write_bytes(broken)
    first = json.loads(original.decode().splitlines()[next(i for i, line in enumerate(
        original.decode().splitlines()) if '"outcome":"passed"' in line)])  # fmt: skip
    out = lab.sandbench("verify", cid, *reg, check=1)
    assert (
        f"/{first['mode']}/{first['workload']}/{first['env_index']}/1: hosts/lab-test/records.jsonl"
        in out.stdout
        and "not a valid record" in out.stdout
    )


def test_sigint_mid_environment_then_resume_records_each_once(lab: Lab) -> None:
    """Ctrl-C mid-environment cleans up and stops; --resume finishes with every environment once."""
    proc = subprocess.Popen(lab.argv("run", lab.plan(SLOW_PLAN), *lab.run_args()),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    records = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        cids = list(lab.data.iterdir()) if lab.data.exists() else []
        records = cids[0] / "hosts" / "lab-test" / "records.jsonl" if cids else None
        if records is not None and records.exists() and records.read_text().count("\n") >= 1:
            break
        time.sleep(0.05)
    time.sleep(0.6)  # the second environment is now inside its 1.5 s start
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr
    cid = _campaign_id(stdout)
    assert "stopped; resume with --resume" in stdout
    assert records is not None and records.read_text().count("\n") == 1
    assert _leftover_environments(lab) == []  # the interrupted environment was cleaned up
    assert not _sleepers()
    out = lab.sandbench("run", "--resume", cid, "--json", *lab.run_args())
    assert _campaign_id(out.stdout) == cid
    printed = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [p["schema"] for p in printed] == [SCHEMA_VERSION] * 3
    assert all(p["signature"] for p in printed)
    recs = Store(lab.data).records(cid)
    assert sorted(r.env_index for r in recs) == [0, 1, 2]
    assert [r.outcome for r in recs] == ["passed"] * 3
    lab.sandbench("verify", cid, "--data", str(lab.data), "--registry", str(lab.registry))


def _sleepers() -> list[int]:
    """Processes still running the slow mode's `sleep 1.5` (none may outlive its environment)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd[:1] == [b"/bin/sh"] and b"sleep 1.5" in b" ".join(cmd):
            found.append(int(pid))
    return found


def _one_line(out: subprocess.CompletedProcess[str], message: str) -> None:
    """Nothing on stdout; one line on stderr, the error ``message`` (a prefix of it)."""
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stdout + out.stderr
    assert out.stderr.startswith(f"sandbench: error: {message}"), out.stderr


def test_verify_of_a_missing_campaign_or_data_directory_is_bad_input(lab: Lab) -> None:
    """verify of an unknown campaign id, or with --data naming nothing or a file: one line,
    exit 2, nothing written (it used to fail writing verification.json)."""
    lab.data.mkdir()
    (lab.root / "a-file").write_text("x\n")
    cases = {
        lab.data: f"no campaign 'c-20250101-abcd' under {lab.data} (recent: none)",
        lab.root / "nowhere": f"data directory {lab.root / 'nowhere'} does not exist: give --data",
        lab.root / "a-file": f"data directory {lab.root / 'a-file'} is not a directory",
    }
    for data, message in cases.items():
        before = files_of(lab.root)
        out = lab.sandbench("verify", "c-20250101-abcd", "--data", str(data), "--registry",
                            str(lab.registry), check=2)  # fmt: skip
        _one_line(out, message)
        assert files_of(lab.root) == before


def test_run_refused_for_a_name_registered_with_another_key_leaves_no_trace(lab: Lab) -> None:
    """run as a host whose name the registry holds with another key, with no key yet or with a
    key of its own: exit 2, one line, and not a byte of the registry, the keys or the store
    changes (no host or coordinator key made, no coordinator trusted, no campaign)."""
    other = HostKey.generate("lab-test").public_b64()
    lab.sandbench("hosts", "add", "lab-test", other, "--registry", str(lab.registry))
    plan = lab.plan(SLOW_PLAN)
    before = files_of(lab.root)
    assert sorted(before) == ["home", "home/hosts.json", "home/hosts.lock", "plan.toml"]
    out = lab.sandbench("run", plan, *lab.run_args(), check=2)
    _one_line(out, "host 'lab-test' is already registered with another key: registered ")
    assert "this host has no key yet" in out.stderr
    assert files_of(lab.root) == before
    assert HostKey.generate("lab-test").save(lab.key)  # a key of its own, not the registered one
    before = files_of(lab.root)
    out = lab.sandbench("run", plan, *lab.run_args(), check=2)
    _one_line(out, "host 'lab-test' is already registered with another key: registered ")
    assert "sandbench hosts add --replace lab-test" in out.stderr
    assert files_of(lab.root) == before
    blocker = lab.root / "a-file"
    blocker.write_text("x\n")
    before = files_of(lab.root)
    out = lab.sandbench("run", plan, *lab.run_args(), "--work-root", str(blocker), check=2)
    _one_line(out, f"--work-root {blocker}: {blocker} is not a directory")
    assert files_of(lab.root) == before


def test_run_resume_of_an_unknown_campaign_leaves_no_trace(lab: Lab) -> None:
    """run --resume of a campaign that is not stored: exit 2, one line, no key or registry made."""
    lab.data.mkdir()
    before = files_of(lab.root)
    out = lab.sandbench("run", "--resume", "c-20250101-abcd", *lab.run_args(), check=2)
    _one_line(out, f"no campaign 'c-20250101-abcd' under {lab.data}")
    assert files_of(lab.root) == before
