"""command mode: real wrappers from a template run the payload; placeholders and preflight."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import require_binary

from contract.errors import ModeUnavailable
from contract.records import EnvironmentSpec, Quota
from worker.modes import EnvContext, HostInfo, get_mode
from worker.modes.command import CommandMode
from worker.runner import run_environment

WRAPPERS = {
    "taskset": ["taskset", "-c", "{cpus}", "{payload_argv}"],
    "nice": ["nice", "-n", "5", "{payload_argv}"],
    "setpriv": ["setpriv", "--no-new-privs", "{payload_argv}"],
    "unshare": ["unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "{payload_argv}"],
    "bwrap-dev-bind": ["bwrap", "--dev-bind", "/", "/", "--unshare-net", "--", "{payload_argv}"],
    "shell-string": "cd {workspace} && exec nice -n 1 {payload_argv}",
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work root shared by this module's environments."""
    return tmp_path_factory.mktemp("command-work")


@pytest.mark.parametrize("name", list(WRAPPERS))
def test_wrapper_runs_the_payload(root: Path, name: str) -> None:
    """A command mode wrapping the payload in a real runtime passes; preflight facts recorded."""
    template = WRAPPERS[name]
    require_binary("nice" if isinstance(template, str) else template[0])
    spec = EnvironmentSpec(
        campaign="c-cmd", host="local", mode=f"cmd-{name}", workload="publish", env_index=0,
        scale=0.02, work_root=str(root), mode_options={"template": template},
    )  # fmt: skip
    record = run_environment(spec)
    assert record is not None and record.outcome == "passed", record and record.detail
    assert record.provenance["preflight"]["ok"]


def test_placeholders(tmp_path: Path) -> None:
    """Every placeholder is filled; {payload_argv} expands in a list, shell-quoted in a string."""
    spec = EnvironmentSpec(
        campaign="c", host="h", mode="x", workload="seq-write", env_index=0, scale=0.5,
        work_root=str(tmp_path), quota=Quota(cpus="1", cpu_quota=0.5, memory_bytes=1 << 30),
    )  # fmt: skip
    env = EnvContext(spec, tmp_path / "my ws", tmp_path / "env", "/")
    template = ["run", "{cpus}", "{cpu_quota}", "{memory_bytes}", "{env_dir}", "{python}",
                "{payload}", "--", "{payload_argv}"]  # fmt: skip
    argv = CommandMode("x", {"template": template}).launcher(env)
    assert argv[:5] == ["run", "1", "0.5", str(1 << 30), str(tmp_path / "env")]
    assert argv[5] == env.python and argv[6] == str(env.payload)
    assert argv[8:] == env.payload_argv(str(tmp_path / "my ws"))
    shell = CommandMode("x", {"template": "exec {payload_argv}"}).launcher(env)
    assert shell[:2] == ["/bin/sh", "-c"] and f"'{tmp_path / 'my ws'}'" in shell[2]


def test_preflight_names_a_missing_binary() -> None:
    """Preflight fails, naming the binary, when the template's program does not exist."""
    mode = get_mode("vendor", {"template": ["/opt/none/vendor-sandbox", "{payload_argv}"]})
    preflight = mode.preflight(HostInfo())
    assert not preflight.ok and "/opt/none/vendor-sandbox" in preflight.reason
    assert get_mode("nice", {"template": "nice {payload_argv}"}).preflight(HostInfo()).ok


def test_template_required() -> None:
    """A command mode without a template is refused with what to add."""
    with pytest.raises(ModeUnavailable, match="needs a 'template'"):
        get_mode("command")
