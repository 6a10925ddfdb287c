"""The main job: `sandbench run --preset smoke` completes; `sandbench report` rebuilds it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.plan.file import preset
from coordinator.plan.sentinel import points
from coordinator.store.store import Store
from worker.modes import BUILTIN_MODES
from workloads.catalog import CALIBRATION

SMOKE_TIMEOUT_S = 1500


@pytest.mark.slow
def test_smoke_preset_completes_and_report_reproduces(tmp_path: Path) -> None:
    """Every mode whose preflight passes completes every cell; `report` rebuilds results.csv."""
    data, key, registry = (
        tmp_path / "data",
        tmp_path / "home" / "host.key",
        tmp_path / "home" / "hosts.json",
    )
    argv = [sys.executable, "-m", "coordinator", "run", "--preset", "smoke", "--data", str(data),
            "--work-root", str(tmp_path / "work"), "--key", str(key), "--registry", str(registry),
            "--host-name", "lab-smoke", "--no-progress"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    m = re.fullmatch(r"campaign: (c-\d{8}-[0-9a-f]{4})", out.stdout.strip().splitlines()[-1])
    assert m is not None
    cid = m.group(1)
    store = Store(data)
    campaign = store.load_campaign(cid)
    _, plan = preset("smoke")
    cells = [s for s in campaign.specs if s.kind == "environment"]
    guests = sum(info.boots_guest for info in BUILTIN_MODES.values())
    planned = (19 * (len(BUILTIN_MODES) - guests) + guests) * 3
    assert len(cells) == len(plan.cells()) * plan.environments == planned
    sentinel = len(CALIBRATION) * points(planned, plan.sentinel.every)  # a point: each once
    assert len(campaign.specs) - len(cells) == sentinel
    records = store.records(cid)
    assert sorted(r.key() for r in records) == sorted(s.key() for s in campaign.specs)
    modes = store.provenance(cid, "lab-smoke")["modes"]
    available = {name for name, verdict in modes.items() if verdict["ok"]}
    assert available, "no mode can run on this host"
    failures = [f"{r.mode}/{r.workload}#{r.env_index}: {r.reason}: {r.detail}"
                for r in records if r.mode in available and r.outcome != "passed"]  # fmt: skip
    assert failures == [], "\n".join(failures)
    unavailable = {r.mode for r in records if r.outcome == "not-run"} - available
    assert all((r.reason or "").startswith("preflight: ") for r in records if r.mode in unavailable)
    csv = data / cid / "hosts" / "lab-smoke" / "results.csv"
    before = csv.read_bytes()
    sandbench = [sys.executable, "-m", "coordinator"]
    rebuilt = subprocess.run([*sandbench, "report", cid, "--data", str(data)],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert csv.read_bytes() == before
    verify_argv = [*sandbench, "verify", cid, "--data", str(data), "--registry", str(registry)]
    verify = subprocess.run(verify_argv, capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout
    report = (data / cid / "report.md").read_text()
    assert "VM modes run only: publish" in report
    assert re.search(r"Their share of the environments' wall time: [\d.]+% \(", report)
