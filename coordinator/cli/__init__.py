"""The ``sandbench`` command line: one module per command group, registered here.

Exit codes: 0 success, 1 a check failed (verify, tests of a campaign), 2 bad input.
"""

from __future__ import annotations

import importlib
import sys

import click

from tasks.errors import SandbenchError, one_line

# Command-group modules of this package; each defines ``register(group)``.
COMMAND_MODULES = ("workloads", "modes", "env", "campaign", "compare", "host", "vm", "fleet")


class _Main(click.Group):
    """Top-level group that turns every ``SandbenchError`` into one line and exit status 2."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except SandbenchError as exc:
            click.echo(f"sandbench: error: {one_line(exc)}", err=True)
            sys.exit(2)
        except (IsADirectoryError, NotADirectoryError) as exc:  # a damaged store or a wrong path
            kind = "is a directory" if isinstance(exc, IsADirectoryError) else (
                "has a file where a directory belongs")  # fmt: skip
            where = one_line(exc.filename)
            click.echo(f"sandbench: error: {where}: {kind} (damaged or wrong path)", err=True)
            sys.exit(2)


@click.group(cls=_Main)
@click.version_option(package_name="sandbench")
def main() -> None:
    """sandbench: how long file-intensive tasks take under each execution mode."""


for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"coordinator.cli.{_name}")
    except ModuleNotFoundError as _exc:  # a command group not built yet
        if _exc.name != f"coordinator.cli.{_name}":
            raise
        continue
    _module.register(main)
