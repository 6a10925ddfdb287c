"""``sandbench host`` and ``sandbench hosts``: this host's key, the trusted registry, its daemons.

The commands live in their own modules so each area owns its file: the keys and the registry
here (``host_keys``), this host's checks, leftovers and daemons on the lab host's side
(``worker.cli``).
"""

from __future__ import annotations

import click

import coordinator.cli.host_keys as host_keys  # noqa: PLR0402 -- not from the package: its __init__ imports this module
from worker.cli import host_check, host_clean, host_docker

HOST_COMMAND_MODULES = (host_keys, host_docker, host_clean, host_check)


@click.group("host")
def host_group() -> None:
    """This host: its signing key, its private daemons and its leftovers."""


@click.group("hosts")
def hosts_group() -> None:
    """The registry of trusted lab hosts (name -> Ed25519 public key)."""


def register(main: click.Group) -> None:
    """Attach ``host`` and ``hosts`` and every plug-in's commands to ``main``."""
    for module in HOST_COMMAND_MODULES:
        module.register(host_group, hosts_group)
    main.add_command(host_group)
    main.add_command(hosts_group)
