"""``sandbench host check [--json]``: every requirement of this lab host, ok or failed with its fix.

Exit status 0 when every line is ok, 1 when one fails (the lines say what to do).
``sandbench host check-broker``: the broker of ``$SANDBENCH_BROKER`` answers with this host's
password (``ops/install.sh`` asks it before it starts a unit); exit 2 with one line otherwise.
``sandbench host harness-commit --repo DIR [--record]``: the commit the installed harness names
in its provenance (a venv has no git tree; ``ops/install.sh`` records its repository's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from contract.files import write_atomic
from contract.options import broker_option
from contract.paths import DEFAULT_WORK_ROOT
from worker.hostcheck import Check
from worker.hostcheck_tools import run_checks

FAILED_STATUS = 1
NAME_WIDTH = 16


@click.command("check")
@click.option("--json", "as_json", is_flag=True, help="Print the lines as one JSON object.")
@click.option(
    "--work-root", type=click.Path(path_type=Path), default=DEFAULT_WORK_ROOT, show_default=True,
    help="where environments will run (disk space and overlayfs are checked there)",
)  # fmt: skip
def check(as_json: bool, work_root: Path) -> None:
    """Check this host: cgroups and the quota, sandboxes, overlayfs, dockerd, KVM, disk, key."""
    lines = run_checks(work_root=work_root)
    bad = [line.name for line in lines if not line.ok]
    if as_json:
        doc = {"ok": not bad, "failed": bad, "checks": [line.as_dict() for line in lines]}
        click.echo(json.dumps(doc, indent=2))
    else:
        for line in lines:
            click.echo(_text(line))
        verdict = f"{len(bad)} failed ({', '.join(bad)})" if bad else "all passed"
        click.echo(f"host check: {len(lines) - len(bad)} ok, {verdict}")
    if bad:
        sys.exit(FAILED_STATUS)


@click.command("check-broker")
@broker_option
def check_broker_cmd(broker: str | None) -> None:
    """Check that the broker answers PING with this host's URL and password."""
    from contract.app import broker_url
    from contract.broker import broker_address, check_broker

    url = broker_url(broker)
    check_broker(url)  # FleetError: "refused the password" or "unreachable", one line, exit 2
    click.echo(f"broker at {broker_address(url)}: answers")


@click.command("harness-commit")
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The sandbench repository this host is installed from.")  # fmt: skip
@click.option("--wheels", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A wheelhouse: the commit it was built from (its sandbench-commit) comes "
              "first.")  # fmt: skip
@click.option("--record", is_flag=True,
              help="Also write it where the installed harness reads it (its venv).")  # fmt: skip
def harness_commit_cmd(repo: Path, wheels: Path | None, record: bool) -> None:
    """Print the commit being installed: the wheelhouse's, else the repository's at REPO."""
    from worker.provenance import COMMIT_FILE, UNKNOWN, git_commit, recorded_commit

    commit = recorded_commit(wheels / COMMIT_FILE) if wheels is not None else UNKNOWN
    commit = commit if commit != UNKNOWN else git_commit(repo)
    if record and commit != UNKNOWN:
        write_atomic(Path(sys.prefix) / COMMIT_FILE, commit + "\n", mode=0o644)
    click.echo(commit)


def _text(line: Check) -> str:
    """One line of the report, and its fix on the next when it failed."""
    head = f"{'ok' if line.ok else 'FAIL':<5} {line.name:<{NAME_WIDTH}} {line.detail}"
    return head if line.ok else f"{head}\n{'':<{NAME_WIDTH + 6}}fix: {line.fix}"


def register(host_group: click.Group, hosts_group: click.Group) -> None:
    """Attach ``check``, ``check-broker`` and ``harness-commit`` to the ``host`` group."""
    host_group.add_command(check)
    host_group.add_command(check_broker_cmd)
    host_group.add_command(harness_commit_cmd)
