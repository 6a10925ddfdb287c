"""Execution modes: one module per mode, registered by name here."""

from __future__ import annotations

import importlib
from typing import Any

from tasks.errors import ModeUnavailable
from worker.modes.base import EnvContext, HostInfo, Mode, Preflight

# name -> "module:Class"; a mode is one file in this package.
BUILTIN_MODES: dict[str, str] = {
    "native": "worker.modes.native:NativeMode",
    "host": "worker.modes.host:HostMode",
    "staged": "worker.modes.staged:StagedMode",
    "docker": "worker.modes.docker:DockerMode",
    "podman": "worker.modes.podman:PodmanMode",
    "vm": "worker.modes.vm:VmMode",
    "vm-writeback": "worker.modes.vm:VmWritebackMode",
    "vm-disk": "worker.modes.vm:VmDiskMode",
    "vm-microvm": "worker.modes.vm:VmMicrovmMode",
}

__all__ = ["BUILTIN_MODES", "EnvContext", "HostInfo", "Mode", "Preflight", "get_mode", "mode_names"]


def mode_names() -> list[str]:
    """Names of the built-in modes, in the design's order."""
    return list(BUILTIN_MODES)


def get_mode(name: str, options: dict[str, Any] | None = None) -> Mode:
    """The mode called ``name``; a ``command`` mode is built from ``options['template']``."""
    options = options or {}
    if options.get("template") is not None or name == "command":
        from worker.modes.command import CommandMode

        return CommandMode(name, options)
    if name not in BUILTIN_MODES:
        import difflib

        near = difflib.get_close_matches(name, list(BUILTIN_MODES) + ["command"], n=1)
        hint = f"; did you mean '{near[0]}'?" if near else ""
        raise ModeUnavailable(
            f"'{name}' is not a mode{hint} (modes: {', '.join(BUILTIN_MODES)}, or a command "
            "mode with a template)"
        )
    module_name, cls_name = BUILTIN_MODES[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ModeUnavailable(f"mode '{name}' is not built yet ({exc})") from exc
    cls = getattr(module, cls_name)
    # a mode whose preflight depends on its options (vm: a forced accelerator) builds from them
    mode: Mode = cls.from_options(options) if hasattr(cls, "from_options") else cls()
    return mode
