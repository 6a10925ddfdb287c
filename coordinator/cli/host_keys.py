"""``sandbench host init`` and ``sandbench hosts add|list``: host keys and the trusted registry."""

from __future__ import annotations

import json
from pathlib import Path

import click

from coordinator.registry import HostRegistry
from tasks.paths import DEFAULT_HOME, sandbench_home
from tasks.signing import KEY_FILE, HostKey

REGISTRY_FILE = "hosts.json"


@click.command("init")
@click.option(
    "--home", type=click.Path(path_type=Path), default=None,
    help=f"Directory of the key and registry (default $SANDBENCH_HOME or {DEFAULT_HOME}).",
)  # fmt: skip
@click.option("--name", default=None, help="Host name for a new key (default: the hostname).")
@click.option("--quiet", is_flag=True, help="Print nothing (for set-up scripts).")
def host_init(home: Path | None, name: str | None, quiet: bool) -> None:
    """Create this host's Ed25519 key if absent (idempotent) and trust it locally."""
    home = home or sandbench_home()
    path = home / KEY_FILE
    existed = path.exists()
    key = HostKey.load_or_create(path, name=name)
    HostRegistry(home / REGISTRY_FILE).add(key.name, key.public_b64())
    if quiet:
        return
    click.echo(
        f"{'existing' if existed else 'new'} host key {path}: host '{key.name}', id {key.key_id}"
    )
    click.echo("register it on the coordinator with:")
    click.echo(f"  sandbench hosts add {key.name} {key.public_b64()}")


@click.command("add")
@click.argument("name")
@click.argument("pubkey")
@click.option("--registry", "registry_path", type=click.Path(path_type=Path), default=None,
              help="Registry file (default $SANDBENCH_HOME/hosts.json).")  # fmt: skip
def hosts_add(name: str, pubkey: str, registry_path: Path | None) -> None:
    """Trust host NAME's records signed with PUBKEY (base64, from 'sandbench host init')."""
    registry = HostRegistry(registry_path)
    added = registry.add(name, pubkey)
    click.echo(f"{'added' if added else 'already registered'}: {name} in {registry.path}")


@click.command("list")
@click.option("--registry", "registry_path", type=click.Path(path_type=Path), default=None,
              help="Registry file (default $SANDBENCH_HOME/hosts.json).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the registry as JSON.")
def hosts_list(registry_path: Path | None, as_json: bool) -> None:
    """The trusted hosts and their public keys."""
    entries = HostRegistry(registry_path).entries()
    if as_json:
        click.echo(json.dumps(entries, indent=2, sort_keys=True))
        return
    for name in sorted(entries):
        click.echo(
            f"{name}  {entries[name]['public_key']}  added {entries[name].get('added_at', '?')}"
        )
    if not entries:
        click.echo("no trusted hosts yet: 'sandbench host init' trusts this one")


def register(host_group: click.Group, hosts_group: click.Group) -> None:
    """Attach ``host init`` and ``hosts add|list``."""
    host_group.add_command(host_init)
    hosts_group.add_command(hosts_add)
    hosts_group.add_command(hosts_list)
