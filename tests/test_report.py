"""The report: results.csv rows, incomplete cells with their reasons, a page Chromium renders."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import files_of, require
from markdown_it import MarkdownIt
from PIL import Image
from test_analysis import _campaign

from contract.errors import StoreError
from coordinator.results.report import write_report
from coordinator.store.store import Store

CID = "c-20261129-ab12"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]  # fmt: skip


def _stored(tmp_path: Path) -> Store:
    specs, records = _campaign()
    store = Store(tmp_path / "data")
    plan = {"name": "hand", "cohort": "default", "seed": 0, "environments": 3, "rounds": 3,
            "modes": ["native", "staged", "vm"], "workloads": ["publish", "seq-write"],
            "notes": ["hand-built records"]}  # fmt: skip
    store.create_campaign("# hand-built\n", plan, specs)
    for r in records:
        store.append_record(r)
    store.write_provenance(CID, "lab-a", {"cpu_model": "test CPU", "tools": {"git": "git 2.39"}})
    return store


def test_results_csv_rows_and_reproducibility(tmp_path: Path) -> None:
    """results.csv holds one row per cell with the hand-computed values; a rebuild is identical."""
    store = _stored(tmp_path)
    paths = write_report(store, CID)
    csv = (tmp_path / "data" / CID / "hosts" / "lab-a" / "results.csv").read_bytes()
    lines = csv.decode().splitlines()
    assert lines[0].startswith("host,cohort,mode,workload,group,attempt,status,reason,planned,ran")
    assert (
        "lab-a,default,native,publish,workflow,1,complete,,3,3,3,0,0,0,0,9,0.750000,,,,20.000000,"
        "0.600000;0.900000;0.750000" in lines
    )
    assert (
        "lab-a,default,vm,publish,workflow,1,preflight-failed,preflight failed: no KVM and no TCG,"
        "3,0,0,0,0,3,0,0,,,,,," in lines
    )
    assert len(lines) == 1 + 5 and len(paths.results) == 2
    write_report(store, CID)
    assert (tmp_path / "data" / CID / "hosts" / "lab-a" / "results.csv").read_bytes() == csv


def test_markdown_shows_dash_with_reason_one_line_away(tmp_path: Path) -> None:
    """An incomplete cell is '— [n]' and note [n] right below its table gives the reason."""
    write_report(_stored(tmp_path), CID)
    md = (tmp_path / "data" / CID / "report.md").read_text()
    assert "| seq-write (ms) | — [1] | 600 |" in md  # 0.6 s: a row below 1 s is in ms
    assert (
        "[1] native / seq-write: env 1 failed (task/oracle-mismatch: out/x); 1 not run under "
        "the first-failure-rule" in md
    )
    sections = ("Headline", "Task completion per workflow and mode",
                "Small writes and synchronization", "Ready and the startup range", "Coverage",
                "Failures and missing observations", "Provenance", "Configuration")  # fmt: skip
    for section in sections:
        assert section in md
    assert (
        "| 0 |" not in md.split("Ready and the startup range")[0]
    )  # never a zero for a missing cell
    assert "| publish (ms) | 750 | — [1] | — [2] |" in md  # lab-a: 0.75 s
    assert "| publish (s) | 24 |" in md  # lab-b: every value of the row is 1 s or more
    assert "fastest mode 'native' at 750 ms" in md and "fastest mode 'native' at 24 s" in md
    figures = sorted(p.name for p in (tmp_path / "data" / CID / "plots").iterdir())
    assert "lab-a-default-workflows.svg" in figures and all(f.endswith(".svg") for f in figures)
    assert "![lab-a-default-workflows](plots/lab-a-default-workflows.svg)" in md


def _screenshot(page: Path, shot: Path, size: str = "1280,2400") -> np.ndarray:
    """RGB pixels of ``page`` as headless Chromium renders it in a window of ``size``."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    require(chromium is not None, "chromium (apt package chromium, installed by ops/setup.sh)")
    assert chromium is not None
    profile = shot.parent / "chromium-profile"
    argv = [chromium, *CHROMIUM_FLAGS, f"--window-size={size}", f"--user-data-dir={profile}",
            f"--screenshot={shot}", page.as_uri()]  # fmt: skip
    subprocess.run(argv, capture_output=True, timeout=120, check=True)
    return np.asarray(Image.open(shot).convert("RGB")).astype(int)


def test_html_is_self_contained_and_renders(tmp_path: Path) -> None:
    """report.html loads nothing from elsewhere and headless Chromium renders it to a picture."""
    write_report(_stored(tmp_path), CID)
    page = tmp_path / "data" / CID / "report.html"
    text = page.read_text()
    assert "<svg" in text and " src=" not in text and "<link" not in text and "<script" not in text
    assert "title='native / seq-write: env 1 failed" in text
    pixels = _screenshot(page, tmp_path / "report.png")
    assert pixels.shape == (2400, 1280, 3)
    assert (pixels.mean(axis=2) < 128).mean() > 0.005  # text and plots, not a blank page


def test_task_time_figure_shows_each_environment_and_dashes(tmp_path: Path) -> None:
    """A figure has a point per environment; an incomplete cell no bar but '—' and its reason."""
    write_report(_stored(tmp_path), CID)
    figure = (tmp_path / "data" / CID / "plots" / "lab-a-default-workflows.svg").read_text()
    points = re.findall(r"<path class='env' d='([^']*)'", figure)
    assert sum(d.count("h0") for d in points) == 3  # native / publish: its 3 environments
    assert "<title>native / publish: median 0.75 s</title>" in figure  # the one bar
    assert "staged / publish" not in "".join(re.findall(r"<rect[^>]*>.*?</rect>", figure))
    for why in ("staged / publish: 1 of 3 have no record yet",
                "vm / publish: preflight failed: no KVM and no TCG"):  # fmt: skip
        assert f"—<title>{why}</title></text>" in figure
    assert "median environment task time (ms)" in figure  # every value below 1 s
    lab_b = (tmp_path / "data" / CID / "plots" / "lab-b-default-workflows.svg").read_text()
    assert "median environment task time (s)" in lab_b  # 21-27 s


def test_figure_renders_not_blank(tmp_path: Path) -> None:
    """The workflow figure alone, rendered by Chromium, shows its bar, its points and its dashes."""
    write_report(_stored(tmp_path), CID)
    text = (tmp_path / "data" / CID / "report.html").read_text()
    figure = text[text.index("<figure>") : text.index("</figure>") + len("</figure>")]
    assert "Task completion per workflow and mode: host lab-a" in figure
    page = tmp_path / "figure.html"
    page.write_text(f"<!doctype html><html><body style='margin:0'>{figure}</body></html>")
    pixels = _screenshot(page, tmp_path / "figure.png", "960,420")
    (tmp_path / "figure.png").rename(tmp_path / "data" / "figure.png")  # kept to look at

    def share(rgb: tuple[int, int, int], tolerance: int = 12) -> float:
        return float((np.abs(pixels - np.array(rgb)).max(axis=2) <= tolerance).mean())

    assert share((0x4E, 0x79, 0xA7)) > 0.005  # native's bar (its color, 4e79a7)
    assert share((0xAA, 0x00, 0x00), 40) > 0.00002  # the red dashes of the incomplete cells
    assert (pixels.mean(axis=2) < 80).mean() > 0.002  # points, axes and text
    assert share((255, 255, 255), 0) < 0.97  # not blank


def test_tails_are_shown_only_when_n_allows() -> None:
    """N=3 shows the median alone; N=30 adds the bootstrap interval and P95 beside it."""
    from test_analysis import _rec, _spec

    from coordinator.results.analysis import analyze
    from coordinator.results.report import cell_table

    for n, pattern in ((3, r"2"), (30, r"15\.5 \[\d+(\.\d+)?, \d+(\.\d+)?\] P95 28\.55")):
        specs = [_spec("lab-a", "native", "publish", i) for i in range(n)]
        records = [_rec(s, [float(s.env_index + 1)], 1.0) for s in specs]
        table = cell_table(analyze(records, specs).tables[0], ["publish"], "caption")
        assert table is not None and re.fullmatch(pattern, str(table.rows[0][1]))


def test_a_damaged_record_line_is_named_never_counted(tmp_path: Path) -> None:
    """A line that is not a record stops the report with its file and line number."""
    store = _stored(tmp_path)
    path = tmp_path / "data" / CID / "hosts" / "lab-a" / "records.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace('"outcome":"passed"', '"outcome":"passeD"')
    path.write_text("".join(lines))
    with pytest.raises(StoreError, match=r"lab-a/records.jsonl line 3: not a valid record"):
        write_report(store, CID)


def test_units_per_row_and_none_for_a_row_of_dashes() -> None:
    """A row below 1 s is in ms, a row with 1 s or more in s, a row of dashes has no unit."""
    from test_analysis import _rec, _spec

    from contract.records import failed_fields
    from coordinator.results.analysis import analyze
    from coordinator.results.report import cell_table

    specs = [_spec("lab-a", "native", w, 0) for w in ("publish", "seq-write", "copy-tree")]
    records = [_rec(specs[0], [0.25, 0.5]), _rec(specs[1], [0.5, 0.75]),
               _rec(specs[2], [0.1], 1.0, **failed_fields("timeout"))]  # fmt: skip
    table = cell_table(analyze(records, specs).tables[0], ["publish", "seq-write", "copy-tree"], "")
    assert table is not None
    assert [row[:2] for row in table.rows] == [
        ["publish (ms)", "750"], ["seq-write (s)", "1.25"], ["copy-tree", ("—", 1)]]  # fmt: skip


# Notes with newlines and Markdown: a heading, emphasis, a link, raw HTML, an entity, code, a
# table cell, strikethrough and math, each of which report.md once rendered.
INJECTING_NOTE = (
    "first line\n# Injected heading\n\n* bullet _em_ [link](http://x) <b>bold</b> &amp; "
    "| pipe | `code` ~~gone~~ $x$ \\\\ end"
)
NOTES_PLAN = f"""name = "notes"
scale = 0.02
environments = 1
rounds = 1
sentinel = false
workloads = ["publish"]
modes = ["native"]
notes = [{json.dumps(INJECTING_NOTE)}, "two  spaces\\tand a tab"]
"""


def test_plan_notes_are_one_line_of_plain_text_in_the_report(tmp_path: Path) -> None:
    """A plan's notes reach report.md folded to one line with Markdown escaped: rendered, each is
    one list item whose text is the note as written; report.html shows the same text."""
    plan = tmp_path / "plan.toml"
    plan.write_text(NOTES_PLAN)
    env = {**os.environ, "SANDBENCH_HOME": str(tmp_path / "home")}
    argv = [sys.executable, "-m", "coordinator", "run", str(plan), "--data", str(tmp_path / "data"),
            "--work-root", str(tmp_path / "work"), "--no-progress"]  # fmt: skip
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    cid = out.stdout.strip().splitlines()[-1].removeprefix("campaign: ")
    md = (tmp_path / "data" / cid / "report.md").read_text()
    folded = " ".join(INJECTING_NOTE.split())
    rendered = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(md)
    assert f"<li>note: {html.escape(folded, quote=False)}</li>" in rendered
    assert "<li>note: two spaces and a tab</li>" in rendered
    assert "Injected heading</h1>" not in rendered and "<b>bold" not in rendered
    assert not re.search(r"^#+ Injected", md, flags=re.MULTILINE)
    page = (tmp_path / "data" / cid / "report.html").read_text()
    assert f"<li>note: {html.escape(folded)}</li>" in page


@pytest.mark.parametrize("name", ["campaign.json", "hosts/lab-a/provenance.json"])
def test_report_of_a_json_file_that_is_not_json_is_one_line(tmp_path: Path, name: str) -> None:
    """`sandbench report` when campaign.json or a provenance is not JSON: one line naming the
    file, exit 2, and nothing in the store written or changed."""
    _stored(tmp_path)
    path = tmp_path / "data" / CID / name
    path.write_text('{"campaign": "c-2026')  # cut short
    before = files_of(tmp_path / "data")
    argv = [sys.executable, "-m", "coordinator", "report", CID, "--data", str(tmp_path / "data")]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
    assert out.stderr.startswith(f"sandbench: error: {path} is not ")
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
    assert files_of(tmp_path / "data") == before


def test_report_says_an_unreadable_verification_is_no_verdict(tmp_path: Path) -> None:
    """A verification.json that is not JSON (derived: verify rebuilds it) reads as unverified."""
    _stored(tmp_path)
    (tmp_path / "data" / CID / "verification.json").write_text("{")
    argv = [sys.executable, "-m", "coordinator", "report", CID, "--data", str(tmp_path / "data"),
            "--quiet"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == (
        f"records: unverified: verification.json is unreadable (run 'sandbench verify {CID}')"
    )
