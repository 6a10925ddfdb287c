"""Every declared workload, in the design's table order: the one list payload and host share.

Standard library only (it runs inside every mode). A workload module declares its workloads
in ``DECLARED``; a new workload module is listed once, in ``kit.FAMILIES``. The sentinel's
calibration environments (``workloads.calibration``) are declared the same way but kept apart, in
``CALIBRATION``: the payload and the oracle find them by name, nothing lists them as workloads.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import import_module
from typing import Any

from workloads import kit
from workloads.calibration import DECLARED as CALIBRATION_DECLARED
from workloads.kit import FAMILIES, GROUPS, RESOURCES, SECTIONS, Declaration, PayloadError

MODULES = tuple(import_module(f"workloads.{family}") for family in FAMILIES)


def collect(modules: Iterable[Any]) -> dict[str, Declaration]:
    """The ``DECLARED`` of every module by name, ordered by number; a clash is an error."""
    found = sorted((d for module in modules for d in module.DECLARED), key=lambda d: d.number)
    by_name: dict[str, Declaration] = {}
    for position, declared in enumerate(found, start=1):
        where = f"workload {declared.name!r} (number {declared.number})"
        if declared.number != position:
            raise PayloadError(f"{where}: numbers must run 1..N without gaps or repeats")
        if declared.name in by_name:
            raise PayloadError(f"{where}: the name is declared twice")
        if declared.group not in GROUPS or declared.section not in SECTIONS:
            raise PayloadError(f"{where}: group must be one of {GROUPS}, section of {SECTIONS}")
        _check_resources(where, declared)
        by_name[declared.name] = declared
    return by_name


def _check_resources(where: str, declared: Declaration) -> None:
    """Resources are named from RESOURCES, once each."""
    found = declared.resources
    if not found or len(set(found)) != len(found) or not set(found) <= set(RESOURCES):
        raise PayloadError(f"{where}: resources must be some of {RESOURCES}, once each")


DECLARED = collect(MODULES)


def collect_calibration(declarations: Iterable[Declaration]) -> dict[str, Declaration]:
    """The calibration declarations by name; a name a workload already has is an error."""
    found = {d.name: d for d in declarations}
    for d in found.values():
        _check_resources(f"calibration {d.name!r}", d)
        if len(d.resources) != 1:
            raise PayloadError(f"calibration {d.name!r}: measures exactly one resource")
    if clash := sorted(set(found) & set(DECLARED)):
        raise PayloadError(f"calibration {clash[0]!r}: the name is a workload's")
    return found


CALIBRATION = collect_calibration(CALIBRATION_DECLARED)


# The module that declares each workload and calibration: the payload is told it (``--family``)
# and imports that one alone.
FAMILY = {d.name: family for family, m in zip(FAMILIES, MODULES, strict=True) for d in m.DECLARED}
FAMILY |= dict.fromkeys(CALIBRATION, kit.CALIBRATION)


def declared(name: str) -> Declaration:
    """The declaration of workload (or calibration) ``name``; PayloadError if there is none."""
    found = DECLARED.get(name) or CALIBRATION.get(name)
    if found is None:
        raise PayloadError(f"unknown workload {name!r}")
    return found
