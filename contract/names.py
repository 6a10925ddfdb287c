"""Names that become file and cgroup names: campaign ids, cohorts, hosts, modes, workloads.

Both sides agree on one pattern (``NAME_PATTERN``): 1 to 64 letters, digits, ``.``, ``_`` or
``-``, starting with a letter or a digit. Such a name is never ``..``, holds no ``/``, never
starts with ``.`` (a hidden file) or ``-`` (an option), and leaves room in a file or cgroup
name for the other parts of an environment's key. Every edge where a name arrives (a plan, a
command-line option, a spec or record off the wire, a store path) checks it; anything else is
refused with ``InvalidName`` saying what to write instead.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from contract.errors import InvalidName

MAX_NAME = 64
NAME_CHARS = "A-Za-z0-9._-"  # a regex character class body: what a name may hold
NAME_PATTERN = rf"[A-Za-z0-9][{NAME_CHARS}]{{0,{MAX_NAME - 1}}}"
NAME_RULE = f"1-{MAX_NAME} letters, digits, '.', '_' or '-', starting with a letter or digit"
_NAME_RE = re.compile(rf"{NAME_PATTERN}\Z")


def is_name(value: object) -> bool:
    """Whether ``value`` is a string matching ``NAME_PATTERN``."""
    return isinstance(value, str) and _NAME_RE.match(value) is not None


def check_name(value: object, what: str) -> str:
    """``value`` itself if it is a valid name, else ``InvalidName`` naming ``what`` and the rule."""
    if isinstance(value, str) and is_name(value):
        return value
    raise InvalidName(f"{what} {value!r} is not a usable name: use {NAME_RULE}")


def _validated(value: str) -> str:
    """Pydantic's hook: a ``ValueError`` (which pydantic reports with the field) if not a name."""
    if not is_name(value):
        raise ValueError(f"{value!r} is not a usable name: use {NAME_RULE}")
    return value


# A pydantic field type: a string that is a valid name.
Name = Annotated[str, AfterValidator(_validated)]
