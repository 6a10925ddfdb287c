"""``sandbench dispatch|worker|coordinator|status|rerun|flower``: the fleet commands."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import click

from tasks.errors import FleetError, SandbenchError
from tasks.names import check_name
from tasks.paths import DEFAULT_WORK_ROOT

BROKER_HELP = (
    "broker URL without a password (default: $SANDBENCH_BROKER, else redis://127.0.0.1:6379/0)"
)
DATA_HELP = "data directory of the store"
FOLLOW_INTERVAL_S = 2.0
WORKER_CONCURRENCY = "1"  # one environment at a time per host, whatever its CPU count


def _no_password(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse a password on the command line: every user of the host sees it in ``ps``."""
    if value and urlsplit(value).password:
        raise click.BadParameter(
            "the URL carries a password, which every user sees in 'ps'; put the whole URL in "
            "SANDBENCH_BROKER (on lab hosts: /etc/sandbench/sandbench.env, mode 0600) instead"
        )
    return value


broker_option = click.option("--broker", default=None, help=BROKER_HELP, callback=_no_password)
data_option = click.option(
    "--data", type=click.Path(path_type=Path), default=Path(".data"), help=DATA_HELP
)


def _store(data: Path):  # type: ignore[no-untyped-def]  # coordinator.store imports lazily
    from coordinator.store import Store

    return Store(data)


def _app(broker: str | None):  # type: ignore[no-untyped-def]  # celery is untyped
    from tasks.app import create_app

    return create_app(broker)


@click.command("dispatch")
@click.argument("plan", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--hosts", required=True, help="comma-separated lab hosts, e.g. lab-a,lab-b")
@broker_option
@data_option
@click.option("--work-root", default=None, help="work root named in the specs (hosts may override)")
@click.option(
    "--allow-unregistered",
    is_flag=True,
    help="queue to hosts not in the trusted registry (their records are rejected until "
    "'sandbench hosts add')",
)
def dispatch_cmd(
    plan: Path,
    hosts: str,
    broker: str | None,
    data: Path,
    work_root: str | None,
    allow_unregistered: bool,
) -> None:
    """Expand PLAN per host (seeded order) and queue it to each host's worker."""
    from coordinator.dispatch import dispatch_plan, unregistered_hosts

    names = [check_name(h.strip(), "--hosts:") for h in hosts.split(",") if h.strip()]
    if not names:
        raise FleetError("--hosts names no host; give e.g. --hosts lab-a,lab-b")
    if len(set(names)) < len(names):
        raise FleetError(f"--hosts {hosts} names a host twice; name each lab host once")
    unknown, registry = unregistered_hosts(names) if allow_unregistered else ([], None)
    for name in unknown:
        click.echo(
            f"sandbench: warning: host {name} is not registered in {registry}: its records "
            f"are rejected until 'sandbench hosts add {name} PUBKEY'",
            err=True,
        )
    campaign = dispatch_plan(_app(broker), _store(data), plan, names, work_root, allow_unregistered)
    click.echo(f"queued on {', '.join(f'host.{n}' for n in names)}")
    click.echo(f"campaign: {campaign}")


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
    from tasks.app import host_queue
    from tasks.signing import HostKey, default_key_path
    from worker.config import trusted_coordinator
    from worker.fleet import HOST_ENV, WORK_ROOT_ENV, register_tasks
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
    os.environ[HOST_ENV] = host
    if work_root is not None:
        work_root.mkdir(parents=True, exist_ok=True)
        os.environ[WORK_ROOT_ENV] = str(work_root.resolve())
    _reap_at_start(work_root or DEFAULT_WORK_ROOT)
    app = _app(broker)
    register_tasks(app)
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


@click.group("coordinator", invoke_without_command=True)
@broker_option
@data_option
@click.option("--loglevel", default="INFO")
@click.pass_context
def coordinator_cmd(ctx: click.Context, broker: str | None, data: Path, loglevel: str) -> None:
    """Run the coordinator: verify and store records (taken in batches from queue 'records'),
    record lost runs, finalize hosts ('sandbench coordinator init' makes its key)."""
    if ctx.invoked_subcommand is not None:
        return
    from coordinator.fleet import DATA_ENV, Coordinator, register_tasks
    from coordinator.intake import Intake
    from tasks.app import COORDINATOR_QUEUE

    data.mkdir(parents=True, exist_ok=True)
    os.environ[DATA_ENV] = str(data.resolve())
    app = _app(broker)
    register_tasks(app)
    stop = threading.Event()
    coordinator = Coordinator.from_env(app)
    watcher = threading.Thread(target=coordinator.watch, args=(stop,), daemon=True)
    watcher.start()
    intake = threading.Thread(target=Intake(coordinator).run, args=(stop,), daemon=True)
    intake.start()  # the records queue, in batches (coordinator.intake)
    try:
        app.worker_main(
            [
                "worker",
                "-Q",
                COORDINATOR_QUEUE,
                "-c",
                "1",
                "-P",
                "solo",
                "-n",
                "coordinator@%h",
                "-E",
                "--without-gossip",
                "--without-mingle",
                f"--loglevel={loglevel}",
            ]
        )
    finally:
        stop.set()


@click.command("status")
@click.argument("campaign")
@click.option("--follow", is_flag=True, help="refresh until every host is finalized")
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON")
@broker_option
@data_option
def status_cmd(campaign: str, follow: bool, as_json: bool, broker: str | None, data: Path) -> None:
    """Per-host progress of a fleet campaign, failures with task ids, and what is left."""
    import redis

    from coordinator.status import campaign_status, format_status
    from tasks.app import broker_url
    from tasks.broker import check_broker

    url = broker_url(broker)
    check_broker(url)  # a dead broker: one line and exit 2 ('sandbench report' reads the store)
    client = redis.Redis.from_url(url, decode_responses=True)
    store = _store(data)
    while True:
        status = campaign_status(store, client, campaign)
        click.echo(json.dumps(status) if as_json else format_status(status))
        if not follow or status["finished"]:
            return
        time.sleep(FOLLOW_INTERVAL_S)


@click.command("rerun")
@click.argument("task_id", required=False)
@click.option(
    "--failed",
    "failed_campaign",
    default=None,
    metavar="ID",
    help="rerun every failed cell of campaign ID",
)
@broker_option
@data_option
def rerun_cmd(
    task_id: str | None, failed_campaign: str | None, broker: str | None, data: Path
) -> None:
    """Rerun the cell of TASK_ID (or every failed cell) as a new attempt."""
    from coordinator.dispatch import rerun_failed, rerun_task

    if (task_id is None) == (failed_campaign is None):
        raise click.UsageError("give either TASK_ID or --failed CAMPAIGN_ID")
    app, store = _app(broker), _store(data)
    if task_id is not None:
        campaign, new_ids = rerun_task(app, store, task_id)
    else:
        campaign, new_ids = str(failed_campaign), rerun_failed(app, store, str(failed_campaign))
    click.echo(f"requeued {len(new_ids)} environments")
    for tid in new_ids:
        click.echo(f"task {tid}")
    click.echo(f"campaign: {campaign}")


@click.command("flower")
@broker_option
@click.option("--port", default=5555, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True)
def flower_cmd(broker: str | None, port: int, address: str) -> None:
    """Watch the fleet in Flower: read-only, behind basic auth (user:password from the env)."""
    from coordinator.flower import basic_auth, flower_argv, require_read_only

    os.environ["FLOWER_BASIC_AUTH"] = basic_auth()  # from the environment, never on a command line
    require_read_only()
    _app(broker).start(flower_argv(port, address))


def register(main: click.Group) -> None:
    """Attach the fleet commands to ``main``."""
    from coordinator.cli.host_keys import coordinator_init

    coordinator_cmd.add_command(coordinator_init)
    for command in (dispatch_cmd, worker_cmd, coordinator_cmd, status_cmd, rerun_cmd, flower_cmd):
        main.add_command(command)
