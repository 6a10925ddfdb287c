"""The ``gvisor`` mode: the payload in a gVisor sandbox, runsc as an OCI runtime on a bundle.

Not ``runsc do`` (its own help: "for testing only"), but ``runsc run`` on a bundle this mode
writes in preparation (``<env>/gvisor/bundle/config.json``): the host's root read-only as the
container's root (the toolset, as the sandbox mode binds it), the payload's directory bound
read-only and the workspace read-write at their own paths, a fresh /proc and /dev, read-only
/sys, new pid, ipc, uts, mount and network namespaces with no network (``--network=none``), the
payload as the container's process with the harness's open-files limit and only ``PATH`` in its
environment. No overlay (``--overlay2=none``): gVisor's memory overlay would keep every write
inside the sandbox, which the oracle would see as a mismatch.

The quota: runsc configures cgroups of its own by default, and with no ``cgroupsPath`` puts the
sandbox in a new top-level cgroup named after the container, outside the environment's (the
escape the command template fell into). The mode runs ``runsc --ignore-cgroups``: the sandbox
(Sentry) and its gofer are children of ``runsc run`` and stay in the cgroup the launcher was
spawned into, so the environment's cgroup carries the quota, counts their CPU time and memory,
sees an OOM kill and is what the runner kills. The runner's containment check proves it.

Ready runs from the marker through runsc's start of the sandbox and gofer (the mode's start, as
a VM's boot is inside vm Ready) to the payload's ready line. runsc's state root, its log and the
bundle live in the environment's directory; cleanup runs ``runsc delete --force`` and removes
them; nothing is mounted on the host (the gofer mounts in its own namespace).

Mode options (a plan's ``{ name = "gvisor", options = { ... } }``): ``platform`` (``ptrace``,
``systrap`` or ``kvm``; default ``ptrace``, passed only when this runsc offers it, ``kvm`` also
needs a working /dev/kvm), ``file_access`` (the root's: ``exclusive`` or ``shared``) and
``file_access_mounts`` (the workspace's and payload's); unset, runsc's defaults apply. The
effective version, platform and flags are in the provenance.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from contract.errors import ModeUnavailable
from worker.modes.base import EnvContext, HostInfo, Mode, Preflight
from worker.modes.container import IMAGE_PATH
from worker.modes.native import python_version

RUNSC = "runsc"
INSTALL_FIX = "apt-get install runsc"
PLATFORMS = ("ptrace", "systrap", "kvm")
FILE_ACCESS = ("exclusive", "shared")
OPTIONS = ("platform", "file_access", "file_access_mounts")
DEFAULT_PLATFORM = "ptrace"
GVISOR_DIR = "gvisor"  # in the environment's directory: bundle/, state/, runsc.log
CONTAINER_ID = "sandbench"  # one container per state root, so one name serves
LOG_FILE = "runsc.log"
LOG_TAIL_LINES = 5
PROBE_TIMEOUT_S = 20.0  # a ptrace sandbox runs /bin/true in well under a second
TOOL_TIMEOUT_S = 30.0
# Flags every run gets: runsc's cgroups off (the sandbox stays in the launcher's cgroup), no
# network, no overlay on any mount.
FIXED_FLAGS = ("--ignore-cgroups", "--network=none", "--overlay2=none")
NAMESPACES = ("pid", "ipc", "uts", "mount", "network")


def runsc_path() -> str | None:
    """The runsc binary on PATH, or None."""
    return shutil.which(RUNSC)


def runsc_version(runsc: str) -> str:
    """``runsc --version``'s first line, e.g. ``runsc version 0.0~20221219.0``."""
    done = subprocess.run([runsc, "--version"], capture_output=True, text=True,
                          timeout=TOOL_TIMEOUT_S, check=False)  # fmt: skip
    return (done.stdout.strip().splitlines() or ["?"])[0]


def offered_platforms(runsc: str) -> list[str]:
    """The platforms this runsc offers, from its ``-platform`` flag's help (``runsc flags``):
    "specifies which platform to use: ptrace (default), kvm." -> ``["ptrace", "kvm"]``."""
    done = subprocess.run([runsc, "flags"], capture_output=True, text=True,
                          timeout=TOOL_TIMEOUT_S, check=False)  # fmt: skip
    text = done.stdout + done.stderr
    m = re.search(r"platform to use:([^\n]*)", text)
    if not m:
        return []
    return [p for p in PLATFORMS if re.search(rf"\b{p}\b", m.group(1))]


def kvm_problem() -> str | None:
    """Why /dev/kvm cannot serve gVisor's kvm platform, or None."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return f"the kvm platform needs a working /dev/kvm ({exc.strerror})"
    os.close(fd)
    return None


class GvisorMode(Mode):
    """``gvisor``: runsc on a bundle of the host's root, the workspace bound read-write."""

    name = "gvisor"
    # The Sentry's clock counts an application thread as running while the host throttles it
    # (under a 0.5-core quota four busy threads report 14 s for 2.5 s of the cgroup's CPU), as
    # a guest's does: the CPU-time check asks what it asks of a VM; the placement check (every
    # process of runsc's tree in the environment's cgroup) is the proof that binds.
    reported_cpu_floor = 0.1
    option_names = frozenset(OPTIONS)

    def __init__(
        self,
        platform: str = DEFAULT_PLATFORM,
        file_access: str | None = None,
        file_access_mounts: str | None = None,
    ) -> None:
        if platform not in PLATFORMS:
            known = ", ".join(PLATFORMS)
            raise ModeUnavailable(f"gvisor: platform {platform!r} is not one of {known}")
        access = {"file_access": file_access, "file_access_mounts": file_access_mounts}
        for key, value in access.items():
            if value is not None and value not in FILE_ACCESS:
                raise ModeUnavailable(
                    f"gvisor: {key} {value!r} is not one of {', '.join(FILE_ACCESS)}"
                )
        self.platform = platform
        self.file_access = file_access
        self.file_access_mounts = file_access_mounts

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Self:
        """The mode with the plan's ``platform``, ``file_access`` and ``file_access_mounts``."""
        unknown = sorted(set(options) - set(OPTIONS) - {"template"})
        if unknown:
            raise ModeUnavailable(
                f"gvisor: unknown option(s) {', '.join(unknown)} (it takes {', '.join(OPTIONS)})"
            )
        for key in OPTIONS:
            if key in options and not isinstance(options[key], str):
                raise ModeUnavailable(f"gvisor: option {key} must be a string")
        return cls(
            str(options.get("platform", DEFAULT_PLATFORM)),
            options.get("file_access"),
            options.get("file_access_mounts"),
        )

    def flags(self) -> list[str]:
        """runsc's global flags of this mode (beyond ``--root`` and ``--log``)."""
        chosen = [f"--platform={self.platform}", *FIXED_FLAGS]
        if self.file_access:
            chosen.append(f"--file-access={self.file_access}")
        if self.file_access_mounts:
            chosen.append(f"--file-access-mounts={self.file_access_mounts}")
        return chosen

    # -- preflight ---------------------------------------------------------------------------
    def preflight(self, host: HostInfo) -> Preflight:
        """runsc is installed, offers the platform, and runs a sandbox here; its facts."""
        runsc = runsc_path()
        if runsc is None:
            return Preflight(False, f"runsc (gVisor) is not installed: {INSTALL_FIX}")
        version = runsc_version(runsc)
        offered = offered_platforms(runsc)
        facts: dict[str, Any] = {"runsc": version, "runsc_path": runsc, "platform": self.platform,
                                 "platforms_offered": offered}  # fmt: skip
        if self.platform not in offered:
            why = f"{version} offers the platforms {', '.join(offered) or '(none found)'}"
            return Preflight(False, f"gvisor: platform {self.platform} unavailable: {why}", facts)
        if self.platform == "kvm" and (kvm := kvm_problem()):
            return Preflight(False, f"gvisor: {kvm}", facts)
        problem = self.probe(runsc)
        if problem:
            return Preflight(False, problem, facts)
        flags = " ".join(["--root <env>/gvisor/state --log <env>/gvisor/runsc.log", *self.flags()])
        return Preflight(True, facts={**facts, "runsc_flags": flags, "python": python_version()})

    def probe(self, runsc: str) -> str | None:
        """Why runsc cannot run ``/bin/true`` in this mode's sandbox here, or None."""
        with tempfile.TemporaryDirectory(prefix="sandbench-gvisor-") as tmp:
            base = Path(tmp)
            workspace = base / "ws"
            workspace.mkdir()
            write_bundle(base / "bundle", ["/bin/true"], str(workspace), tmp)
            argv = runsc_argv(runsc, base, self.flags())
            try:  # its own session: a hung sandbox and gofer are killed with runsc
                proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True)  # fmt: skip
            except OSError as exc:
                return f"gvisor: runsc cannot start: {exc}"
            try:
                _, err = proc.communicate(timeout=PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                return (f"gvisor: a probe sandbox on the {self.platform} platform did not "
                        f"finish in {PROBE_TIMEOUT_S:.0f} s (hung)")  # fmt: skip
            finally:
                delete_container(runsc, base)
            if proc.returncode != 0:
                why = err.strip()[-300:] or log_tail(base)
                return f"gvisor: runsc cannot run a sandbox here (status {proc.returncode}): {why}"
        return None

    # -- one environment ---------------------------------------------------------------------
    def prepare(self, env: EnvContext) -> None:
        """Not timed: write the bundle (config.json) and make runsc's state root."""
        base = env.env_dir / GVISOR_DIR
        (base / "state").mkdir(parents=True, exist_ok=True)
        workspace = str(env.workspace)
        write_bundle(base / "bundle", env.payload_argv(workspace), workspace,
                     str(env.payload_dir))  # fmt: skip

    def launcher(self, env: EnvContext) -> list[str]:
        """``runsc run`` of the bundle: the sandbox starts after the marker, inside Ready."""
        return runsc_argv(runsc_path() or RUNSC, env.env_dir / GVISOR_DIR, self.flags())

    def failure_context(self, env: EnvContext) -> str:
        """The tail of runsc's log (why the sandbox did not start, or how it ended)."""
        return log_tail(env.env_dir / GVISOR_DIR)

    def cleanup(self, env: EnvContext) -> None:
        """``runsc delete --force`` (a sandbox left by a kill), then the bundle and state."""
        base = env.env_dir / GVISOR_DIR
        if base.exists():
            delete_container(runsc_path() or RUNSC, base)
            shutil.rmtree(base, ignore_errors=True)


def runsc_argv(runsc: str, base: Path, flags: list[str]) -> list[str]:
    """``runsc run`` of the bundle in ``base`` with its state root and log there."""
    return [
        runsc, f"--root={base / 'state'}", f"--log={base / LOG_FILE}", *flags,
        "run", f"--bundle={base / 'bundle'}", CONTAINER_ID,
    ]  # fmt: skip


def delete_container(runsc: str, base: Path) -> None:
    """``runsc delete --force`` of the container in ``base``'s state root, if any is there."""
    state = base / "state"
    if not state.is_dir() or not any(state.iterdir()):
        return
    subprocess.run([runsc, f"--root={state}", "delete", "--force", CONTAINER_ID],
                   capture_output=True, timeout=TOOL_TIMEOUT_S, check=False)  # fmt: skip


def log_tail(base: Path) -> str:
    """The last lines of runsc's log in ``base``, as one line."""
    path = base / LOG_FILE
    if not path.exists():
        return ""
    tail = path.read_text(errors="replace").strip().splitlines()[-LOG_TAIL_LINES:]
    return f"runsc log: {' | '.join(tail)}" if tail else ""


def bundle_config(args: list[str], workspace: str, payload_dir: str) -> dict[str, Any]:
    """The OCI config of the mode's container: the host's root read-only, the payload's
    directory read-only and the workspace read-write at their own paths, cwd the workspace."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False,
            "user": {"uid": os.geteuid(), "gid": os.getegid()},
            "args": args,
            "env": [f"PATH={IMAGE_PATH}"],
            "cwd": workspace,
            "rlimits": [{"type": "RLIMIT_NOFILE", "soft": nofile[0], "hard": nofile[1]}],
            "noNewPrivileges": True,
        },
        "root": {"path": "/", "readonly": True},
        "hostname": "sandbench",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": payload_dir, "type": "bind", "source": payload_dir,
             "options": ["rbind", "ro"]},
            {"destination": workspace, "type": "bind", "source": workspace,
             "options": ["rbind", "rw"]},
        ],
        "linux": {"namespaces": [{"type": t} for t in NAMESPACES]},
    }  # fmt: skip


def write_bundle(bundle: Path, args: list[str], workspace: str, payload_dir: str) -> None:
    """Write ``bundle/config.json`` for ``args``."""
    bundle.mkdir(parents=True, exist_ok=True)
    text = json.dumps(bundle_config(args, workspace, payload_dir), indent=1)
    (bundle / "config.json").write_text(text + "\n")
