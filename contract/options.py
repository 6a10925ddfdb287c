"""Command-line options that the coordinator's and the lab host's commands share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click

F = TypeVar("F", bound=Callable[..., Any])

BROKER_HELP = (
    "broker URL without a password (default: $SANDBENCH_BROKER, else redis://127.0.0.1:6379/0)"
)


def _no_password(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse a password on the command line: every user of the host sees it in ``ps``."""
    if value and urlsplit(value).password:
        raise click.BadParameter(
            "the URL carries a password, which every user sees in 'ps'; put the whole URL in "
            "SANDBENCH_BROKER (on lab hosts: /etc/sandbench/sandbench.env, mode 0600) instead"
        )
    return value


broker_option = click.option("--broker", default=None, help=BROKER_HELP, callback=_no_password)

DATA_ENV = "SANDBENCH_DATA"  # set in a coordinator host's /etc/sandbench/sandbench.env


def data_option(param: str = "data") -> Callable[[F], F]:
    """``--data DIR``, the campaign store (default ``$SANDBENCH_DATA``, else ``./.data``)."""
    return click.option(
        "--data", param, type=click.Path(path_type=Path), default=Path(".data"), envvar=DATA_ENV,
        show_default=True, help=f"campaign store directory (default ${DATA_ENV}, else .data)",
    )  # fmt: skip
