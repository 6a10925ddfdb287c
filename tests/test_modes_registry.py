"""The mode registry: one line per mode, with the attributes presets and provenance follow."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from coordinator.plan.file import SMOKE_VM_WORKLOADS, preset
from worker.modes import BUILTIN_MODES, REGISTRY, Mode, get_mode, tool_commands
from worker.modes.base import EnvContext, HostInfo, Preflight
from worker.provenance import collect
from workloads.registry import WORKLOADS


def test_each_line_loads_a_mode_of_its_own_name() -> None:
    """Every registry line names a class whose mode carries the line's name."""
    assert len(BUILTIN_MODES) == len(REGISTRY) == 14
    new = {"gvisor", "docker-gvisor", "nsjail", "vm-virtiofs", "vm-virtiofs-writeback"}
    assert set(BUILTIN_MODES) >= new
    for info in REGISTRY:
        assert get_mode(info.name).name == info.name, info.target


def test_every_mode_is_one_class_on_the_base() -> None:
    """Every built-in mode and the command mode subclass Mode, which fills in every hook."""
    for info in REGISTRY:
        assert isinstance(get_mode(info.name), Mode), info.target
    assert isinstance(get_mode("command", {"template": "{payload_argv}"}), Mode)


def test_a_mode_needs_only_a_name_a_preflight_and_a_launcher(tmp_path: Path) -> None:
    """A mode that overrides only the two abstract hooks gets the documented defaults."""

    class Minimal(Mode):
        name = "minimal"

        def preflight(self, host: HostInfo) -> Preflight:
            return Preflight(True)

        def launcher(self, env: EnvContext) -> list[str]:
            return ["true"]

    mode = Minimal.from_options({})
    env = EnvContext(None, tmp_path / "ws", tmp_path / "env", "/x")  # type: ignore[arg-type]
    mode.prepare(env)
    mode.sync(env, 1)
    assert mode.result_root(env) == tmp_path / "ws"
    assert (mode.oom_killed(env), mode.failure_context(env), mode.staged) == (False, "", False)
    assert mode.cgroup_overhead_bytes == 0
    mode.cleanup(env)
    with pytest.raises(TypeError, match="launcher"):  # a mode without one is not instantiable
        type("NoLauncher", (Mode,), {"name": "x", "preflight": Minimal.preflight})()


def test_the_sandbox_mode_keeps_the_name_users_see() -> None:
    """The bubblewrap sandbox mode is still named host, and its code is the sandbox module."""
    mode = get_mode("host")
    assert type(mode).__name__ == "SandboxMode" and type(mode).__module__ == "worker.modes.sandbox"


def test_the_smoke_preset_gives_guest_booting_modes_the_subset() -> None:
    """Modes with boots_guest get the smoke subset, every other mode all workloads."""
    _, smoke = preset("smoke")
    per_mode = Counter(entry.name for entry, _ in smoke.cells())
    for info in REGISTRY:
        expected = len(SMOKE_VM_WORKLOADS) if info.boots_guest else len(WORKLOADS)
        assert per_mode[info.name] == expected, info.name
    assert {i.name for i in REGISTRY if i.boots_guest} == {
        "vm", "vm-writeback", "vm-virtiofs", "vm-virtiofs-writeback", "vm-disk", "vm-microvm"
    }  # fmt: skip


def test_provenance_records_every_tool_the_registry_names(tmp_path: Path) -> None:
    """A host's provenance has a version (or None, if absent) for each mode's tools."""
    facts = collect("lab-a", tmp_path, campaign="c-20261201-1a2b", seed=1, cohort="default",
                    quota={})  # fmt: skip
    assert set(facts["tools"]) == set(tool_commands())
    commands = tool_commands()  # a tool's name -> its version command (nsjail's is a path)
    named = {name for name, argv in commands.items() if " ".join(argv) in
             {cmd for info in REGISTRY for cmd in info.tools}}  # fmt: skip
    assert "nsjail" in named and {"python3", "git", "gcc", "make"} <= set(facts["tools"])
    assert facts["tools"]["python3"].startswith("Python 3")
    for tool in named:
        exe = commands[tool][0]
        installed = shutil.which(exe) or Path("/usr/sbin", exe).exists()
        assert (facts["tools"][tool] is not None) == bool(installed), tool
