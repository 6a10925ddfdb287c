"""The README's first look: run ``benchmarks/first_look.toml`` and print its table.

Every workload at the design's sizes in native, host, docker, podman, gvisor, docker-gvisor and
nsjail, and the three workflows in vm and vm-virtiofs, N = 3 environments of 3 rounds. The table
is each cell's median task time (the report's statistic) with its Ready median, from the
campaign's own results.csv, and a line per mode with what ran (runsc's version and platform, the
accelerator). A failed or incomplete cell is a dash with its reason below the table, never a
number.

    .venv/bin/python benchmarks/first_look.py                 # run it (about 40 min here)
    .venv/bin/python benchmarks/first_look.py --campaign ID   # the table of a finished run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
PLAN = REPO / "benchmarks" / "first_look.toml"
MODES = ("native", "host", "docker", "podman", "gvisor", "docker-gvisor", "nsjail", "vm",
         "vm-virtiofs")  # fmt: skip


def run(data: Path) -> str:
    """Run the plan embedded on this machine; the campaign id."""
    argv = [sys.executable, "-m", "coordinator", "run", str(PLAN), "--data", str(data)]
    done = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, text=True, check=False)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode not in (0, 1) or not last.startswith("campaign: "):  # 1: problems found
        raise SystemExit(f"first_look: the run did not finish (status {done.returncode}); "
                         f"{last} (sandbench run --resume ID continues it)")  # fmt: skip
    return last.removeprefix("campaign: ")


def cell(row: pd.Series) -> str:
    """A cell's median task time (ms below a second), or a dash for a cell with no median."""
    if row["status"] != "complete" or pd.isna(row["task_s_median"]):
        return "-"
    task = float(row["task_s_median"])
    return f"{task * 1000:.0f} ms" if task < 1 else f"{task:.2f} s"


def table(data: Path, campaign: str) -> str:
    """The Markdown table of ``campaign`` and the lines under it."""
    (csv,) = (data / campaign / "hosts").glob("*/results.csv")
    provenance = json.loads((csv.parent / "provenance.json").read_text())
    frame = pd.read_csv(csv)
    modes = [m for m in MODES if m in set(frame["mode"])]
    workloads = list(dict.fromkeys(frame["workload"]))
    lines = ["| workload | " + " | ".join(modes) + " |", "|---" * (len(modes) + 1) + "|"]
    for workload in workloads:
        rows = frame[frame["workload"] == workload].set_index("mode")
        cells = [cell(rows.loc[m]) if m in rows.index else "" for m in modes]
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    ready = frame.groupby("mode")["ready_ms_median"].median()
    shown = [f"{ready[m]:.0f} ms" if m in ready and not pd.isna(ready[m]) else "" for m in modes]
    lines.append("| Ready (median of cells) | " + " | ".join(shown) + " |")
    lines.append("")
    for _, row in frame[frame["status"] != "complete"].iterrows():
        lines.append(f"- {row['mode']} / {row['workload']}: {row['reason']}")
    for mode in modes:
        facts = provenance.get("modes", {}).get(mode, {})
        keys = ("runsc", "platform", "runtime", "accel", "workspace", "virtiofs_cache", "nsjail")
        shown = ", ".join(f"{k} {facts[k]}" for k in keys if facts.get(k))
        verdict = (shown or "ok") if facts.get("ok") else f"preflight failed: {facts.get('reason')}"
        lines.append(f"- {mode}: {verdict}")
    facts = {k: provenance.get(k) for k in ("cpu_model", "kernel", "date")}
    lines.append(f"- host: {facts}; campaign {campaign}")
    return "\n".join(lines)


def main() -> None:
    """Run (or read) the first look and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO / ".data")
    parser.add_argument("--campaign", help="print the table of this finished campaign")
    args = parser.parse_args()
    campaign = args.campaign or run(args.data)
    print(table(args.data, campaign))


if __name__ == "__main__":
    main()
