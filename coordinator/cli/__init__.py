"""The ``sandbench`` command line: one module per command group, registered here.

The coordinator's commands are this package's modules, the lab host's own (``worker``, ``host
check|clean|docker``, ``vm``, ``modes``) are ``worker.cli``'s. Each module defines
``register(group)``; every one is imported by name, so a renamed or missing module fails the
command at once instead of dropping its commands.

Exit codes: 0 success, 1 a check failed (verify, tests of a campaign), 2 bad input.
"""

from __future__ import annotations

import sys

import click

from contract.errors import SandbenchError, one_line
from coordinator.cli import campaign, compare, env, fleet, host, workloads
from worker.cli import modes, vm, worker

COMMAND_MODULES = (workloads, modes, env, campaign, compare, host, vm, fleet, worker)


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


for _module in COMMAND_MODULES:
    _module.register(main)
