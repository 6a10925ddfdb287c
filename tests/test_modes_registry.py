"""The mode registry: one line per mode, with the attributes presets and provenance follow."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

from coordinator.plan import SMOKE_VM_WORKLOADS, preset
from worker.modes import BUILTIN_MODES, REGISTRY, get_mode, tool_commands
from worker.provenance import collect
from workloads.registry import WORKLOADS


def test_each_line_loads_a_mode_of_its_own_name() -> None:
    """Every registry line names a class whose mode carries the line's name."""
    assert len(BUILTIN_MODES) == len(REGISTRY) == 9
    for info in REGISTRY:
        assert get_mode(info.name).name == info.name, info.target


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
        "vm", "vm-writeback", "vm-disk", "vm-microvm"
    }  # fmt: skip


def test_provenance_records_every_tool_the_registry_names(tmp_path: Path) -> None:
    """A host's provenance has a version (or None, if absent) for each mode's tools."""
    facts = collect("lab-a", tmp_path, campaign="c-20261201-1a2b", seed=1, cohort="default",
                    quota={})  # fmt: skip
    assert set(facts["tools"]) == set(tool_commands())
    named = {cmd.split()[0] for info in REGISTRY for cmd in info.tools}
    assert named <= set(facts["tools"]) and {"python3", "git", "gcc", "make"} <= set(facts["tools"])
    assert facts["tools"]["python3"].startswith("Python 3")
    for tool in named:
        installed = shutil.which(tool) or Path("/usr/sbin", tool).exists()
        assert (facts["tools"][tool] is not None) == bool(installed), tool
