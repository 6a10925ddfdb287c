"""``sandbench dispatch|worker|coordinator|status|rerun|flower``: the fleet commands."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from contract.environ import inherited
from contract.errors import FleetError
from contract.names import check_name
from contract.options import broker_option
from contract.options import data_option as store_option

if TYPE_CHECKING:
    from celery import Celery

    from coordinator.store.store import Store

FOLLOW_INTERVAL_S = 2.0


data_option = store_option()


def _store(data: Path) -> Store:  # (imported when called: the CLI's start stays fast)
    from coordinator.store.store import Store

    return Store(data)


def _app(broker: str | None) -> Celery:
    from contract.app import create_app

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
    from coordinator.fleet.dispatch import dispatch_plan, unregistered_hosts

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
    from contract.app import COORDINATOR_QUEUE
    from contract.broker import redis_client
    from coordinator.fleet.clocks import FleetClocks
    from coordinator.fleet.coordinator import Coordinator, register_tasks
    from coordinator.fleet.intake import Intake
    from coordinator.store.store import Store
    from coordinator.store.trust import HostRegistry

    data.mkdir(parents=True, exist_ok=True)
    app = _app(broker)
    clocks = FleetClocks.from_environment(inherited())  # the one read of the coordinator's clocks
    client = redis_client(app.conf.broker_url)
    coordinator = Coordinator(Store(data.resolve()), HostRegistry(), client, app, clocks)
    register_tasks(coordinator)
    stop = threading.Event()
    watcher = threading.Thread(target=coordinator.watch, args=(stop,), daemon=True)
    watcher.start()
    intake = threading.Thread(target=Intake(coordinator).run, args=(stop,), daemon=True)
    intake.start()  # the records queue, in batches (coordinator.fleet.intake)
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

    from contract.app import broker_url
    from contract.broker import check_broker
    from coordinator.fleet.status import campaign_status, format_status

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
    from coordinator.fleet.dispatch import rerun_failed, rerun_task

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
    from coordinator.fleet.flower import basic_auth, flower_argv, require_read_only

    # Flower reads its auth from its own variable: set here, never on a command line
    os.environ["FLOWER_BASIC_AUTH"] = basic_auth()  # noqa: TID251 -- a setting handed to Flower
    require_read_only()
    _app(broker).start(flower_argv(port, address))


def register(main: click.Group) -> None:
    """Attach the fleet commands to ``main``."""
    from coordinator.cli.host_keys import coordinator_init

    coordinator_cmd.add_command(coordinator_init)
    for command in (dispatch_cmd, coordinator_cmd, status_cmd, rerun_cmd, flower_cmd):
        main.add_command(command)
