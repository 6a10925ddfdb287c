"""The README's command templates for other runtimes pass `plan show`; bad templates do not."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from contract.records import EnvironmentSpec
from coordinator.plan.file import parse_plan
from tests.conftest import REPO, require_binary
from worker.modes import EnvContext, get_mode
from worker.modes.command import template_problem

SANDBENCH = [sys.executable, "-m", "coordinator"]


def readme_runtime_plan() -> str:
    """The README's plan of other runtimes: its one ``toml`` block that names modes."""
    blocks = re.findall(r"```toml\n(.*?)```", (REPO / "README.md").read_text(), flags=re.DOTALL)
    plans = [b for b in blocks if re.search(r"^\[\[modes\]\]", b, flags=re.MULTILINE)]
    assert len(plans) == 1, "the README has exactly one toml plan with modes: the runtimes plan"
    return plans[0]


def readme_modes() -> list[dict[str, Any]]:
    """The mode tables of the README's runtimes plan."""
    modes: list[dict[str, Any]] = tomllib.loads(readme_runtime_plan())["modes"]
    return modes


def plan_show(path: Path) -> subprocess.CompletedProcess[str]:
    """``sandbench plan show PATH`` as a subprocess."""
    argv = [*SANDBENCH, "plan", "show", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)


def test_readme_shows_only_what_is_not_built_in() -> None:
    """The README's plan keeps the one runtime sandbench does not ship: Firecracker's jailer
    (gVisor and nsjail are built-in modes, and a command mode may not take their names)."""
    binaries = {mode["name"]: mode["template"][0] for mode in readme_modes()}
    assert binaries == {"firecracker": "jailer"}


def test_readme_runtime_plan_passes_plan_show(tmp_path: Path) -> None:
    """`plan show` validates the README's runtimes plan as written and expands it."""
    plan = tmp_path / "runtimes.toml"
    plan.write_text(readme_runtime_plan())
    out = plan_show(plan)
    assert out.returncode == 0, out.stderr
    assert "19 workloads x 1 mode x 3 environments = 57 environments" in out.stdout


@pytest.mark.parametrize("name", [m["name"] for m in readme_modes()])
def test_each_readme_template_passes_plan_show(tmp_path: Path, name: str) -> None:
    """Each README template, alone in a plan, passes `plan show`."""
    mode = next(m for m in readme_modes() if m["name"] == name)
    plan = tmp_path / f"{name}.toml"
    # JSON strings and arrays of strings are TOML values as they stand
    plan.write_text("[[modes]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in mode.items()))
    out = plan_show(plan)
    assert out.returncode == 0, out.stderr
    assert f"19 workloads each: {name}" in out.stdout


BAD = {
    "unknown placeholder": (
        '["runsc", "do", "-cwd", "{workspce}", "{payload_argv}"]',
        "template has an unknown placeholder {workspce} (did you mean {workspace}?",
    ),
    "empty template": ('"   "', "template is empty"),
    "empty element": ('["nsjail", "", "{payload_argv}"]', "template has an empty element"),
    "unbalanced braces": (
        '"runsc do {payload_argv"',
        "template has unbalanced braces: '{' at column 10 of 'runsc do {payload_argv' is never",
    ),
    "stray closing brace": (
        '"nsjail -- {payload_argv}}"',
        "template has unbalanced braces: '}' at column 25",
    ),
    "argv in a path": ('"{payload_argv}", root = "{payload_argv}"', "root has an unknown"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_template_is_one_error_line(tmp_path: Path, case: str) -> None:
    """A malformed template fails `plan show` with exit 2 and one line saying what is wrong."""
    template, message = BAD[case]
    plan = tmp_path / "bad.toml"
    plan.write_text(f'modes = [{{ name = "x", template = {template} }}]\n')
    out = plan_show(plan)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"bad.toml: modes[0] 'x': {message}" in lines[0], out.stderr


@pytest.mark.parametrize(
    "template",
    ["echo ${HOME} && exec {payload_argv}", 'sh -c "{ true; }" && {payload_argv}',
     ["awk", "{ print }", "{payload}"]],
)  # fmt: skip
def test_shell_braces_are_not_placeholders(template: str | list[str]) -> None:
    """Shell parameter expansions and balanced non-placeholder braces are accepted."""
    assert template_problem(template) is None


def test_env_run_rejects_a_bad_template(tmp_path: Path) -> None:
    """`env run --template` with an unknown placeholder exits 2 naming it."""
    argv = [*SANDBENCH, "env", "run", "--mode", "x", "--template", "nice {paylod_argv}",
            "--workload", "publish", "--scale", "0.02", "--work-root", str(tmp_path)]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 2 and "unknown placeholder {paylod_argv}" in out.stderr


def _firecracker_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, EnvContext]:
    """The README's Firecracker mode and an environment with a small workspace, a stand-in
    kernel and an empty root image named by ``FC_KERNEL`` and ``FC_ROOTFS``."""
    entry = next(
        m for m in parse_plan(readme_runtime_plan()).mode_entries() if m.name == "firecracker"
    )
    workspace, env_dir = tmp_path / "ws", tmp_path / "env"
    (workspace / "d").mkdir(parents=True)
    (workspace / "a.txt").write_text("hello\n")
    (workspace / "d" / "b.bin").write_bytes(os.urandom(70_000))
    env_dir.mkdir()
    (tmp_path / "vmlinux").write_bytes(b"\0" * 64)
    subprocess.run(["mkfs.ext4", "-q", str(tmp_path / "rootfs.ext4"), "8M"], check=True)
    monkeypatch.setenv("FC_KERNEL", str(tmp_path / "vmlinux"))
    monkeypatch.setenv("FC_ROOTFS", str(tmp_path / "rootfs.ext4"))
    spec = EnvironmentSpec(
        campaign="t", host="local", mode="firecracker", workload="publish", env_index=0,
        scale=0.02, work_root=str(tmp_path), mode_options=entry.mode_options(),
    )  # fmt: skip
    env = EnvContext(spec, workspace, env_dir, "/sandbench/unused")
    return get_mode(entry.name, entry.mode_options()), env


def test_firecracker_prepare_and_collect_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's Firecracker helpers, run for real: prepare builds the jail (kernel, root
    image with the payload's directory, workspace image, a config in Firecracker's shape);
    collect copies the workspace image's tree out, byte for byte."""
    for tool in ("mkfs.ext4", "debugfs"):
        require_binary(tool)
    mode, env = _firecracker_env(tmp_path, monkeypatch)
    mode.prepare(env)
    jail = env.env_dir / "jail" / "firecracker" / "sandbench" / "root"
    config = json.loads((jail / "vm.json").read_text())
    assert set(config) == {"boot-source", "drives", "machine-config"}
    boot = config["boot-source"]
    assert boot["kernel_image_path"] == "/vmlinux" and (jail / "vmlinux").exists()
    payload_argv = boot["boot_args"].split(" -- ")[1].split()
    assert payload_argv[1:6] == ["-I", "-S", "/workloads/payload.py", "--workload", "publish"]
    assert payload_argv[-4:] == ["--root", "/ws", "--family", "workflow"]
    assert [d["path_on_host"] for d in config["drives"]] == ["/rootfs.ext4", "/ws.ext4"]
    assert config["machine-config"] == {"vcpu_count": 2, "mem_size_mib": 2048 - 128}
    listing = subprocess.run(
        ["debugfs", "-R", "ls /workloads", str(jail / "rootfs.ext4")], capture_output=True,
        text=True,
    ).stdout  # fmt: skip
    assert "payload.py" in listing and "protocol.py" in listing  # the bootstrap and its body
    assert mode.launcher(env)[:2] == ["jailer", "--id"]
    result = mode.result_root(env)
    assert result == env.env_dir / "result"
    assert sorted(str(p.relative_to(result)) for p in result.rglob("*")) == [
        "a.txt", "d", "d/b.bin"
    ]  # fmt: skip
    assert (result / "d" / "b.bin").read_bytes() == (env.workspace / "d" / "b.bin").read_bytes()
