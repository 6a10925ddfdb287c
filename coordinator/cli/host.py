"""``sandbench host`` and ``sandbench hosts``: this host's key, the trusted registry, its daemons.

The commands live in plug-in modules (``host_keys``, ``host_docker``) so each area owns its file.
"""

from __future__ import annotations

import importlib

import click

HOST_COMMAND_MODULES = ("host_keys", "host_docker", "host_clean", "host_check")


@click.group("host")
def host_group() -> None:
    """This host: its signing key, its private daemons and its leftovers."""


@click.group("hosts")
def hosts_group() -> None:
    """The registry of trusted lab hosts (name -> Ed25519 public key)."""


def register(main: click.Group) -> None:
    """Attach ``host`` and ``hosts`` and every plug-in's commands to ``main``."""
    for name in HOST_COMMAND_MODULES:
        try:
            module = importlib.import_module(f"coordinator.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"coordinator.cli.{name}":
                raise
            continue
        module.register(host_group, hosts_group)
    main.add_command(host_group)
    main.add_command(hosts_group)
