"""``sandbench run``, ``report``, ``verify`` and ``plan show``: campaigns on this machine."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import click
from rich.console import Console
from rich.table import Table

from contract.errors import PlanError
from contract.options import data_option
from contract.paths import DEFAULT_WORK_ROOT
from contract.signing import COORDINATOR_KEY_FILE, default_coordinator_key_path
from contract.stamps import utc_now
from coordinator.local import (
    OwnKeys,
    RunResult,
    check_planned_here,
    run_campaign,
    summary_line,
)
from coordinator.plan.campaign import describe
from coordinator.plan.file import (
    PRESETS,
    Plan,
    check_runs_here,
    format_cpus,
    load_plan,
    missing_cpus,
    preset,
)
from coordinator.results.analysis import Analysis, HostTables
from coordinator.results.finalize import finalize_host
from coordinator.results.report import TASK_UNIT, cell_table, startup_table, write_report
from coordinator.results.report import Table as ReportTable
from coordinator.store.policy import Verification, verify_campaign
from coordinator.store.store import Store
from coordinator.store.trust import HostRegistry
from coordinator.store.verdict import verdict_of
from worker import trash
from worker.hostinfo import NO_JOURNAL, NO_JOURNAL_WARNING, work_root_journal
from worker.workroot import check_work_root

EXIT_CHECK_FAILED = 1
EXIT_INTERRUPTED = 130
DATA_OPTION = data_option("data_dir")
REGISTRY_OPTION = click.option(
    "--registry", "registry_path", type=click.Path(path_type=Path), default=None,
    help="Trusted host registry (default $SANDBENCH_HOME/hosts.json).",
)  # fmt: skip


def _plan_from(plan_path: Path | None, preset_name: str | None) -> tuple[str, Plan]:
    if (plan_path is None) == (preset_name is None):
        raise PlanError("give a plan file or --preset smoke|reference|full (one of them)")
    return preset(preset_name) if preset_name else load_plan(plan_path)  # type: ignore[arg-type]


def _source(plan_path: Path | None, preset_name: str | None) -> str:
    """How errors name the plan: its path or the preset."""
    return f"preset '{preset_name}'" if preset_name else str(plan_path)


@contextmanager
def _stop_on_signals(stop: threading.Event, console: Console) -> Iterator[None]:
    """First Ctrl-C (or SIGTERM): finish cleaning up the running environment, then stop."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        console.print(
            "[yellow]stopping: cleaning up the running environment (Ctrl-C again to abort)"
        )

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _rich(table: ReportTable) -> list[Table | str]:
    """A report table as a rich table, its caption above and its notes below."""
    out = Table()
    for i, name in enumerate(table.header):
        out.add_column(name, justify="left" if i == 0 else "right")
    for row in table.rows:
        out.add_row(*(f"{c[0]} [{c[1]}]" if isinstance(c, tuple) else c for c in row))
    return [table.caption, out, *(f"[{i}] {n}" for i, n in enumerate(table.notes, 1))]


def tables_for(t: HostTables) -> list[Table | str]:
    """The main tables of one host, as rich renderables: task time, startup, coverage."""
    caption = f"host {t.host}, cohort {t.cohort}: {TASK_UNIT}"
    cells = cell_table(t, list(dict.fromkeys(t.cells["workload"])), caption)
    ready = startup_table(t)
    ready.caption = f"host {t.host}, cohort {t.cohort}: {ready.caption}"
    c = t.coverage
    coverage = (
        f"coverage: planned {c['planned']}, ran {c['ran']}, passed {c['passed']}, "
        f"failed {c['failed']}, not run (rule) {c['not_run_rule']}, "
        f"not run (preflight) {c['not_run_preflight']}, no record {c['pending']}; "
        f"complete cells {c['complete_cells']} of {c['cells']}; "
        f"valid round records {c['valid_rounds']}"
    )
    return [*(_rich(cells) if cells else []), *_rich(ready), coverage]


def _print_items(items: list[Table | str], console: Console) -> None:
    for item in items:
        if isinstance(item, str):
            click.echo(item)
        else:
            console.print(item)


def print_report_table(table: ReportTable, console: Console) -> None:
    """Print one report table: caption, rich table, notes."""
    _print_items(_rich(table), console)


def print_tables(analysis: Analysis, console: Console) -> None:
    """Print every host's main tables (never mixing hosts or cohorts) and its sentinel's share."""
    for t in analysis.tables:
        _print_items(tables_for(t), console)
        if (mark := analysis.sentinel_of(t.host, t.cohort)) is not None:
            click.echo(f"host {t.host}, cohort {t.cohort}: {mark.summary()}")


def _opening_lines(
    plan: tuple[str, Plan] | None, resume_id: str | None, work_root: Path
) -> list[str]:
    """What ``run`` says before it starts: the plan (or the resumed campaign), and a warning
    when the work root's file system makes metadata results drift (ext4 without a journal)."""
    lines = list(describe(plan[1])) if plan else [f"resuming campaign {resume_id}"]
    if work_root_journal(work_root) == NO_JOURNAL:
        lines.append(f"warning: {NO_JOURNAL_WARNING}")
    return lines


def _closing_lines(result: RunResult, work_root: Path) -> list[str]:
    """What ``run`` says after its summary: the wall-time split (when it ran something) and
    what the work root's trash keeps (ext4 without a journal, ``worker.trash``)."""
    lines = result.wall.lines() if result.recorded_now else []
    if held := trash.held(work_root):
        lines.append(f"trash: {held} removed environments' directories kept in "
                     f"{work_root / trash.TRASH_DIR} (deleting them slows later creates on ext4 "
                     "without a journal); sandbench host clean deletes them")  # fmt: skip
    return lines


@click.command("run")
@click.argument("plan_path", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--preset", "preset_name", type=click.Choice(PRESETS), help="A built-in plan.")
@DATA_OPTION
@click.option("--resume", "resume_id", default=None, help="Continue a stopped campaign by id.")
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON lines.")
@click.option(
    "--work-root", type=click.Path(path_type=Path), default=DEFAULT_WORK_ROOT, show_default=True,
    help="Where environments' workspaces live.",
)  # fmt: skip
@click.option("--host-name", default=None, help="Name of this host (default: its key's name).")
@click.option(
    "--key", "key_path", type=click.Path(path_type=Path), default=None,
    help="Host key (default $SANDBENCH_HOME/host.key; created if absent). The coordinator key "
    "that signs the campaign is coordinator.key beside it.",
)  # fmt: skip
@REGISTRY_OPTION
@click.option("--no-progress", is_flag=True, help="No live progress bar.")
def run_command(
    plan_path: Path | None, preset_name: str | None, data_dir: Path, resume_id: str | None,
    as_json: bool, work_root: Path, host_name: str | None, key_path: Path | None,
    registry_path: Path | None, no_progress: bool,
) -> None:  # fmt: skip
    """Run a campaign on this machine (embedded, no broker) and print its tables."""
    # Every check before anything is written: a refused run leaves no key, trust or campaign.
    plan = None if resume_id else _plan_from(plan_path, preset_name)
    if plan:  # it runs here: its CPUs must exist here
        check_runs_here(plan[1], _source(plan_path, preset_name))
    check_work_root(work_root)
    registry = HostRegistry(registry_path)
    signer_path = key_path.parent / COORDINATOR_KEY_FILE if key_path else None
    keys = OwnKeys.check(key_path, host_name, signer_path or default_coordinator_key_path(),
                         registry)  # fmt: skip
    if resume_id:
        check_planned_here(
            resume_id, Store(data_dir).campaign_view(resume_id).hosts, keys.host_name
        )
    key, signer = keys.make(registry)
    store, err = Store(data_dir, signer=signer), Console(stderr=True)
    for line in _opening_lines(plan, resume_id, work_root):
        err.print(line, markup=False, highlight=False, soft_wrap=True)
    stop = threading.Event()
    with _stop_on_signals(stop, err):
        result = run_campaign(
            store, key, plan=plan, resume=resume_id, work_root=work_root,
            registry=registry, stop=stop, console=err, show_progress=not no_progress,
        )  # fmt: skip
    out = Console(width=160) if not sys.stdout.isatty() else Console()
    checked = None
    if result.complete:
        store.seal_host(result.campaign_id, key.name, result.planned)  # as finalize_host will
        checked = verify_and_mark(store, result.campaign_id, registry)
        paths = finalize_host(store, result.campaign_id, key.name).report  # shows the verdict
        if as_json:
            for record in store.records(result.campaign_id):
                click.echo(json.dumps(record.to_json_dict(), sort_keys=True))
        elif paths is not None:
            print_tables(paths.analysis, out)
            click.echo(f"report: {paths.html}")
        for problem in checked.problems:
            click.echo(f"problem: {problem}")
        click.echo(f"records: {checked.verdict}")
    click.echo(summary_line(result))
    for line in _closing_lines(result, work_root):
        click.echo(line)
    click.echo(f"campaign: {result.campaign_id}")
    if not result.complete:
        sys.exit(EXIT_INTERRUPTED)
    if checked is not None and not checked.ok:
        sys.exit(EXIT_CHECK_FAILED)


@click.command("report")
@click.argument("campaign_id")
@DATA_OPTION
@REGISTRY_OPTION
@click.option("--quiet", is_flag=True, help="Print only the paths written.")
def report_command(campaign_id: str, data_dir: Path, registry_path: Path | None,
                   quiet: bool) -> None:  # fmt: skip
    """Rebuild results.csv, plots, report.md and report.html from the raw records."""
    store, registry = Store(data_dir), HostRegistry(registry_path)
    paths = write_report(store, campaign_id, registry)
    if not quiet:
        print_tables(paths.analysis, Console(width=160) if not sys.stdout.isatty() else Console())
    for p in [*paths.results, paths.markdown, paths.html]:
        click.echo(f"wrote {p}")
    click.echo(f"records: {verdict_of(store, campaign_id, registry).text}")


def verify_and_mark(store: Store, campaign_id: str, registry: HostRegistry) -> Verification:
    """Verify a campaign and store the verdict with the digests of the bytes it checked, signed
    by the store's coordinator key."""
    checked = verify_campaign(store, campaign_id, registry)
    now = utc_now()
    store.write_verification(campaign_id, checked.as_json(now))
    return checked


@click.command("verify")
@click.argument("campaign_id")
@DATA_OPTION
@REGISTRY_OPTION
def verify_command(campaign_id: str, data_dir: Path, registry_path: Path | None) -> None:
    """Check the campaign's bytes (signatures, hash chains, heads, expansion), its completeness
    and the first-failure rule; exit 1 unless verified."""
    store = Store(data_dir)  # its signer, this machine's coordinator key, signs the verdict
    store.existing_campaign_dir(campaign_id)  # a missing campaign is bad input, not a verdict
    checked = verify_and_mark(store, campaign_id, HostRegistry(registry_path))
    for p in checked.problems:
        click.echo(f"problem: {p}")
    click.echo(f"campaign {campaign_id}: {checked.verdict}")
    if not checked.ok:
        sys.exit(EXIT_CHECK_FAILED)


@click.group("plan")
def plan_group() -> None:
    """Plan files: validate and show what they expand to."""


@plan_group.command("show")
@click.argument("plan_path", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--preset", "preset_name", type=click.Choice(PRESETS), help="A built-in plan.")
@click.option("--toml", "as_toml", is_flag=True, help="Print the plan's TOML text too.")
def plan_show(plan_path: Path | None, preset_name: str | None, as_toml: bool) -> None:
    """Validate a plan (file or preset) and print its expansion per host."""
    text, plan = _plan_from(plan_path, preset_name)
    if as_toml:
        click.echo(text)
    for line in describe(plan):
        click.echo(line)
    if missing := missing_cpus(plan):
        click.echo(
            f"note: this host lacks CPUs {format_cpus(missing)} of quota.cpus: 'sandbench run' "
            "refuses the plan here; lab hosts that have them can run it"
        )


def register(main: click.Group) -> None:
    """Attach the campaign commands to ``main``."""
    for command in (run_command, report_command, verify_command, plan_group):
        main.add_command(command)
