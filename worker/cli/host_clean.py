"""``sandbench host clean``: remove what earlier environments of a work root left behind."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from contract.errors import SandbenchError
from contract.paths import DEFAULT_WORK_ROOT


@click.command("clean")
@click.option(
    "--work-root",
    type=click.Path(path_type=Path),
    default=DEFAULT_WORK_ROOT,
    show_default=True,
    help="the work root whose leftovers to remove (a worker's --work-root)",
)
@click.option("--json", "as_json", is_flag=True, help="print what was reaped as one JSON object")
def clean(work_root: Path, as_json: bool) -> None:
    """Reap leftovers of dead environments: containers, VMs, processes, cgroups, mounts, files;
    then empty the work root's trash (removed environments kept whole where deleting them
    slows later creates: ext4 without a journal, see worker/trash.py).

    Only what this work root owns is touched, and never an environment whose process still
    runs. Exit status 1 if something could not be removed.
    """
    from worker import trash
    from worker.reaper import reap

    if not work_root.is_dir():
        raise SandbenchError(
            f"--work-root {work_root}: no such directory; give a worker's work root"
        )
    logging.getLogger("sandbench.reaper").setLevel(logging.CRITICAL)  # the lines below say it all
    result = reap(work_root)
    held = trash.held(work_root)
    for problem in trash.empty(work_root):
        result.problem(problem)
    if as_json:
        click.echo(json.dumps({**result.as_dict(), "trash_emptied": held}, sort_keys=True))
    else:
        for line in result.lines():
            click.echo(line)
        if held:
            click.echo(f"emptied the trash: {held} removed environments' directories")
            click.echo("  on ext4 without a journal, files created near the inodes just freed are "
                       "slow for the next 5 min 30 s; a campaign started sooner pays for it in "
                       "its workspace copies (worker/trash.py)")  # fmt: skip
    if result.problems:
        raise SystemExit(1)


def register(host_group: click.Group, hosts_group: click.Group) -> None:
    """Attach ``clean`` to the ``host`` group (nothing under ``hosts``)."""
    host_group.add_command(clean)
