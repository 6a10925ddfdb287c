"""``sandbench host docker start|stop|status``: this host's private Docker daemon."""

from __future__ import annotations

import json

import click

from worker.dockerd import Dockerd


@click.group("docker")
def docker_group() -> None:
    """The private dockerd of the docker mode (never the system's default daemon)."""


@docker_group.command("start")
def start() -> None:
    """Start the private daemon (it stays up until ``sandbench host docker stop``)."""
    daemon = Dockerd()
    started = daemon.start()
    verb = "started" if started else "already running"
    click.echo(f"dockerd {verb}: pid {daemon.pid()}, socket {daemon.socket}")


@docker_group.command("stop")
def stop() -> None:
    """Remove the daemon's containers and stop it."""
    daemon = Dockerd()
    stopped = daemon.stop()
    click.echo(f"dockerd {'stopped' if stopped else 'was not running'} ({daemon.state_dir})")


@docker_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the facts as one JSON object.")
def status(as_json: bool) -> None:
    """Whether the private daemon runs, with its socket, versions and drivers."""
    facts = Dockerd().status()
    if as_json:
        click.echo(json.dumps(facts, sort_keys=True))
        return
    click.echo(f"dockerd: {'running' if facts['running'] else 'stopped'}")
    for key, value in facts.items():
        if key != "running" and value is not None:
            click.echo(f"  {key}: {value}")


def register(host_group: click.Group, hosts_group: click.Group) -> None:
    """Attach ``docker`` to the ``host`` group (nothing under ``hosts``)."""
    host_group.add_command(docker_group)
