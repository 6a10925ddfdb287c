"""Keys: ``host init``, ``hosts add|list`` (the trusted registry), ``coordinator init`` (the
coordinator's own key) and ``host trust-coordinator`` (the one coordinator a worker obeys)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from contract.files import write_atomic
from contract.names import check_name
from contract.paths import DEFAULT_HOME, sandbench_home
from contract.signing import COORDINATOR_KEY_FILE, KEY_FILE, HostKey, fingerprint
from coordinator.store.trust import HostRegistry, own_coordinator_key
from worker.config import COORDINATOR_PUB, ETC_DIR, allow_command_modes, trust_coordinator

REGISTRY_FILE = "hosts.json"
PUBLIC_SUFFIX = ".pub"


@click.command("init")
@click.option(
    "--home", type=click.Path(path_type=Path), default=None,
    help=f"Directory of the key and registry (default $SANDBENCH_HOME or {DEFAULT_HOME}).",
)  # fmt: skip
@click.option("--name", default=None, help="Host name for a new key (default: the hostname).")
@click.option("--quiet", is_flag=True, help="Print nothing (for set-up scripts).")
@click.option(
    "--export", "export_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Also write the public key (only) to EXPORT/NAME.pub, for the coordinator to register.",
)  # fmt: skip
def host_init(home: Path | None, name: str | None, quiet: bool, export_dir: Path | None) -> None:
    """Create this host's Ed25519 key if absent (idempotent) and trust it locally."""
    home = home or sandbench_home()
    path = home / KEY_FILE
    existed = path.exists()
    key = HostKey.load_or_create(path, name=None if name is None else check_name(name, "--name"))
    HostRegistry(home / REGISTRY_FILE).add(key.name, key.public_b64())
    if export_dir is not None:
        exported = export_public_key(key, export_dir)
        if not quiet:
            click.echo(f"public key of '{key.name}' exported to {exported}")
    if quiet:
        return
    click.echo(
        f"{'existing' if existed else 'new'} host key {path}: host '{key.name}', id {key.key_id}"
    )
    click.echo("register it on the coordinator with:")
    click.echo(f"  sandbench hosts add {key.name} {key.public_b64()}")


def export_public_key(key: HostKey, directory: Path) -> Path:
    """Write ``key``'s public half alone to ``directory/NAME.pub`` (atomically); its path."""
    return _export(key.public_b64(), directory / f"{key.name}{PUBLIC_SUFFIX}")


def _export(public_b64: str, target: Path) -> Path:
    """Write a public key alone to ``target`` (mode 0644, atomically); its path."""
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, public_b64 + "\n", mode=0o644)
    return target


@click.command("add")
@click.argument("name")
@click.argument("pubkey")
@click.option("--registry", "registry_path", type=click.Path(path_type=Path), default=None,
              help="Registry file (default $SANDBENCH_HOME/hosts.json).")  # fmt: skip
@click.option("--replace", is_flag=True,
              help="Replace NAME's registered key (the old one stays on file).")  # fmt: skip
@click.option("--coordinator", "is_coordinator", is_flag=True,
              help="PUBKEY is a coordinator's key (NAME labels it): trust the campaigns it "
                   "signed, e.g. to verify a campaign copied from it.")  # fmt: skip
def hosts_add(
    name: str, pubkey: str, registry_path: Path | None, replace: bool, is_coordinator: bool
) -> None:
    """Trust host NAME's records signed with PUBKEY (base64, from 'sandbench host init')."""
    registry = HostRegistry(registry_path)
    if is_coordinator:
        added = registry.add_coordinator(pubkey, label=name)
        state = "added" if added else "already registered"
        click.echo(f"{state}: coordinator key {fingerprint(pubkey)} ({name}) in {registry.path}")
        return
    old = registry.entries().get(name)
    if not registry.add(name, pubkey, replace=replace):
        click.echo(f"already registered: {name} in {registry.path}")
    elif old is None:
        click.echo(f"added: {name} in {registry.path} (fingerprint {fingerprint(pubkey)})")
    else:
        click.echo(
            f"replaced: {name} in {registry.path}: fingerprint "
            f"{fingerprint(old['public_key'])} -> {fingerprint(pubkey)}"
        )


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


@click.command("init")
@click.option(
    "--home", type=click.Path(path_type=Path), default=None,
    help=f"Directory of the key and registry (default $SANDBENCH_HOME or {DEFAULT_HOME}).",
)  # fmt: skip
@click.option(
    "--export", "export_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help=f"Also write the public key (only) to EXPORT/{COORDINATOR_PUB}, for the workers.",
)  # fmt: skip
@click.option("--quiet", is_flag=True, help="Print nothing (for set-up scripts).")
def coordinator_init(home: Path | None, export_dir: Path | None, quiet: bool) -> None:
    """Create the coordinator's Ed25519 key if absent (idempotent) and trust it locally."""
    path = (home or sandbench_home()) / COORDINATOR_KEY_FILE
    existed = path.exists()
    key = own_coordinator_key(path)
    exported = _export(key.public_b64(), export_dir / COORDINATOR_PUB) if export_dir else None
    if quiet:
        return
    click.echo(f"{'existing' if existed else 'new'} coordinator key {path}: id {key.key_id}")
    if exported is not None:
        click.echo(f"public key exported to {exported}")
    click.echo("each lab host's worker must trust it (it runs only specs this key signed):")
    click.echo(f"  ops/install.sh --role worker ... --coordinator-key {exported or 'FILE'}")
    click.echo(f"  or: sandbench host trust-coordinator {key.public_b64()}")


# The worker configuration's directory, for the commands that write into it.
CONFIG_HOME_OPTION = click.option(
    "--home", type=click.Path(path_type=Path), default=None,
    help=f"Directory of the worker configuration (default $SANDBENCH_HOME; {ETC_DIR} is "
    "install.sh's).",
)  # fmt: skip


@click.command("trust-coordinator")
@click.argument("pubkey")
@CONFIG_HOME_OPTION
@click.option("--replace", is_flag=True, help="Replace a coordinator key trusted before.")
def host_trust_coordinator(pubkey: str, home: Path | None, replace: bool) -> None:
    """Make this lab host's worker run specs signed by coordinator key PUBKEY (or a file)."""
    text = Path(pubkey).read_text().strip() if Path(pubkey).is_file() else pubkey
    path = trust_coordinator(text, home or sandbench_home(), replace=replace)
    click.echo(f"trusted: coordinator key {fingerprint(text)} in {path}")


@click.command("allow-command-modes")
@click.argument("names", default="")
@CONFIG_HOME_OPTION
@click.option("--keep", is_flag=True, help="With no NAMES, keep an existing worker.toml as it is.")
def host_allow_command_modes(names: str, home: Path | None, keep: bool) -> None:
    """Let this lab host's worker run the command modes NAMES (comma-separated; none: empty)."""
    listed = [n.strip() for n in names.split(",") if n.strip()]
    path = allow_command_modes(listed, home or sandbench_home(), keep=keep)
    if path is not None:
        click.echo(f"command modes allowed on this worker: {', '.join(listed) or 'none'} ({path})")


def register(host_group: click.Group, hosts_group: click.Group) -> None:
    """Attach ``host init``, ``host trust-coordinator``, ``host allow-command-modes`` and
    ``hosts add|list``."""
    host_group.add_command(host_init)
    host_group.add_command(host_trust_coordinator)
    host_group.add_command(host_allow_command_modes)
    hosts_group.add_command(hosts_add)
    hosts_group.add_command(hosts_list)
