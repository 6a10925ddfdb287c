"""``sandbench worker``: this lab host's Celery worker, its own queue, one environment at a time."""

from __future__ import annotations

from pathlib import Path

import click

from contract.errors import SandbenchError
from contract.names import check_name
from contract.options import broker_option
from contract.paths import DEFAULT_WORK_ROOT

WORKER_CONCURRENCY = "1"  # one environment at a time per host, whatever its CPU count


@click.command("worker")
@click.option("--host", "host", required=True, help="this lab host's name (its queue: host.NAME)")
@broker_option
@click.option(
    "--work-root",
    type=click.Path(path_type=Path),
    default=None,
    help="where environments run (default: the plan's work root)",
)
@click.option("--loglevel", default="INFO")
def worker_cmd(host: str, broker: str | None, work_root: Path | None, loglevel: str) -> None:
    """Run this host's Celery worker: its own queue only, one environment at a time."""
    from contract.app import host_queue
    from contract.signing import HostKey, default_key_path
    from worker.config import trusted_coordinator
    from worker.fleet import LabWorker, register_tasks
    from worker.hostcheck import require_quota
    from worker.presence import add_presence

    require_quota()  # a quota this host cannot apply: refuse now, naming the check and its fix
    key = HostKey.load_or_create(default_key_path(), name=check_name(host, "--host"))
    click.echo(
        f"host {host}: key {key.key_id} (register: sandbench hosts add {host} {key.public_b64()})",
        err=True,
    )
    trusted, source = trusted_coordinator()
    click.echo(f"host {host}: runs specs signed by coordinator key {source}" if trusted else
               f"host {host}: WARNING: trusts no coordinator key ({source}): every spec will be "
               "refused until 'sandbench host trust-coordinator FILE'", err=True)  # fmt: skip
    if work_root is not None:
        work_root.mkdir(parents=True, exist_ok=True)
        work_root = work_root.resolve()
    _reap_at_start(work_root or DEFAULT_WORK_ROOT)
    from contract.app import create_app

    app = create_app(broker)
    register_tasks(LabWorker(app, host, work_root))
    add_presence(app, host)
    app.worker_main(
        [
            "worker",
            "-Q",
            host_queue(host),
            "-c",
            WORKER_CONCURRENCY,
            "-P",
            "prefork",
            "-n",
            f"{host}@%h",
            "-E",
            "--without-gossip",
            "--without-mingle",
            f"--loglevel={loglevel}",
        ]
    )


def _reap_at_start(work_root: Path) -> None:
    """Before the first message: remove what earlier runs on this work root left (each logged)."""
    from worker.reaper import reap

    if not work_root.is_dir():
        return
    try:
        lines = reap(work_root).lines()
    except (OSError, SandbenchError) as exc:  # the worker still starts; the log says why
        lines = [f"failed on {work_root}: {exc} (run 'sandbench host clean' to see)"]
    for line in lines:
        click.echo(f"reaper: {line}", err=True)


def register(main: click.Group) -> None:
    """Attach ``sandbench worker`` to ``main``."""
    main.add_command(worker_cmd)
