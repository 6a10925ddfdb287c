"""sandbench's private podman store: its own storage, state, configuration and OCI runtime.

Podman has no daemon. Everything it creates for sandbench lives in one state directory
(``$SANDBENCH_PODMAN_DIR``, else ``podman/`` in the sandbench home, see ``contract.paths``)::

    containers.conf  storage.conf  hooks.d/  root/  run/  tmp/

Every podman process sandbench starts carries the same global flags (the store's paths, the
cgroupfs manager, file events, the OCI runtime chosen for this host, an empty OCI hooks
directory) and reads only this directory's configuration files (``CONTAINERS_CONF``,
``CONTAINERS_STORAGE_CONF``), so a host's /etc/containers cannot change sandbench's containers.

The OCI runtime is chosen per host: crun on a pure cgroup v2 host, runc otherwise (crun refuses
a hybrid v1/v2 layout); ``$SANDBENCH_PODMAN_RUNTIME`` overrides the choice.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from contract.environ import setting
from contract.errors import ModeUnavailable
from contract.paths import sandbench_home
from worker.hostinfo import cgroup_version

STATE_DIR_ENV = "SANDBENCH_PODMAN_DIR"
PODMAN_ENV = "SANDBENCH_PODMAN"
RUNTIME_ENV = "SANDBENCH_PODMAN_RUNTIME"
DEFAULT_PODMAN = "/usr/bin/podman"
CLIENT_TIMEOUT_S = 120.0
STORAGE_DRIVER = "overlay"
# podman 4.3 lowers its own RLIMIT_NPROC to 32768 before it starts conmon, and the OCI runtime
# may only lower limits (no CAP_SYS_RESOURCE needed): a container's nproc must not exceed it.
PODMAN_NPROC_CAP = 32768
CONTAINERS_CONF = """\
# Written by sandbench. podman reads only this file (CONTAINERS_CONF): the host's
# /etc/containers cannot change sandbench's containers. What sandbench relies on is given on
# the command line; everything else is podman's compiled-in default.
[engine]
# conmon's cleanup command (a podman process) reads the same configuration.
conmon_env_vars = [{conmon_env}]
"""
STORAGE_CONF = """\
# Written by sandbench (CONTAINERS_STORAGE_CONF): the private store, no host storage options.
[storage]
driver = "{driver}"
graphroot = "{root}"
runroot = "{run}"
"""


class PodmanError(ModeUnavailable):
    """podman is missing, or a podman command sandbench ran failed."""


def default_state_dir() -> Path:
    """The state directory named by the environment, else the default."""
    if directory := setting(STATE_DIR_ENV):
        return Path(directory)
    return sandbench_home() / "podman"


def find_binary(name: str) -> str | None:
    """Path of executable ``name`` (a path, or a name on PATH or in /usr/sbin), or None."""
    if "/" in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    sbin = Path("/usr/sbin") / name
    return shutil.which(name) or (str(sbin) if os.access(sbin, os.X_OK) else None)


def choose_runtime() -> tuple[str, str]:
    """The OCI runtime for this host (name or path) and why it was chosen."""
    if runtime := setting(RUNTIME_ENV):
        return runtime, f"${RUNTIME_ENV}"
    layout = cgroup_version()
    if layout == "v2" and find_binary("crun"):
        return "crun", "crun: pure cgroup v2 host"
    if layout == "v2":
        return "runc", "runc: pure cgroup v2 host, crun not installed"
    return "runc", f"runc: cgroup {layout.split(' ')[0]} host (crun refuses non-v2 layouts)"


def ulimit_options() -> list[str]:
    """``--ulimit`` options at this process's own limits (nproc capped at podman's own)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = [min(PODMAN_NPROC_CAP, value) for value in resource.getrlimit(resource.RLIMIT_NPROC)]
    return [f"--ulimit=nofile={nofile[0]}:{nofile[1]}", f"--ulimit=nproc={nproc[0]}:{nproc[1]}"]


@dataclass
class Podman:
    """One private store, identified by its state directory, and the binaries that use it."""

    state_dir: Path = field(default_factory=default_state_dir)
    podman: str = field(default_factory=lambda: setting(PODMAN_ENV) or DEFAULT_PODMAN)
    runtime: str = ""  # name or path; chosen for this host when empty
    runtime_reason: str = ""

    def __post_init__(self) -> None:
        if not self.runtime:
            self.runtime, self.runtime_reason = choose_runtime()

    def flags(self) -> list[str]:
        """The global flags of every podman command on this store."""
        s = self.state_dir
        return [
            f"--root={self.graph_root}", f"--runroot={s / 'run'}", f"--tmpdir={s / 'tmp'}",
            f"--storage-driver={STORAGE_DRIVER}", "--cgroup-manager=cgroupfs",
            "--events-backend=file", f"--runtime={self.runtime_path()}",
            f"--hooks-dir={s / 'hooks.d'}",
        ]  # fmt: skip

    @property
    def graph_root(self) -> Path:
        """The store's images and containers (containers/storage's ``graphroot``)."""
        return self.state_dir / "root"

    def static_dir(self, container_id: str) -> Path | None:
        """Where this store keeps a container's own files (podman's ``StaticDir``): containers/
        storage's ``<graphroot>/<driver>-containers/<id>/userdata``, the directory ``create``
        made; None where it is not there (another layout: ask ``podman inspect``)."""
        path = self.graph_root / f"{STORAGE_DRIVER}-containers" / container_id / "userdata"
        return path if container_id.isalnum() and path.is_dir() else None

    def environ(self) -> dict[str, str]:
        """The variables that point podman at this store's configuration files only."""
        return {
            "CONTAINERS_CONF": str(self.state_dir / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(self.state_dir / "storage.conf"),
        }

    def command(self, *args: str, cwd: Path | None = None) -> list[str]:
        """A podman command line on this store, with its environment (and ``cwd``) in argv."""
        env = [f"{k}={v}" for k, v in self.environ().items()]
        chdir = ["-C", str(cwd)] if cwd is not None else []
        return ["/usr/bin/env", *chdir, *env, self.podman, *self.flags(), *args]

    def run(self, *args: str, input: bytes | None = None, timeout: float = CLIENT_TIMEOUT_S) -> str:
        """Run a podman command on this store; its stdout, or ``PodmanError`` with its stderr."""
        try:
            proc = subprocess.run(
                self.command(*args), input=input, check=False, capture_output=True, timeout=timeout
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PodmanError(f"podman {args[0]}: {exc}") from exc
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip()
            raise PodmanError(f"podman {' '.join(args[:2])} failed ({proc.returncode}): {err}")
        return proc.stdout.decode(errors="replace")

    def runtime_path(self) -> str:
        """The chosen OCI runtime's path (its name if it is not installed)."""
        return find_binary(self.runtime) or self.runtime

    def check_binaries(self) -> None:
        """Raise ``PodmanError`` naming the fix when podman, conmon or the runtime is missing."""
        for what, name, env in (
            ("podman", self.podman, PODMAN_ENV),
            ("conmon", "conmon", None),
            ("OCI runtime", self.runtime, RUNTIME_ENV),
        ):
            if find_binary(name) is None:
                hint = f", or point {env} at it" if env else ""
                raise PodmanError(
                    f"{what} not found at {name} (install it with ops/setup.sh{hint})"
                )

    def setup(self) -> None:
        """Check the binaries; create the state directory and its configuration files."""
        self.check_binaries()
        s = self.state_dir
        for sub in ("", "hooks.d", "root", "run", "tmp"):
            (s / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        conmon_env = ", ".join(f'"{k}={v}"' for k, v in self._conmon_env().items())
        _write_if_changed(s / "containers.conf", CONTAINERS_CONF.format(conmon_env=conmon_env))
        storage = STORAGE_CONF.format(driver=STORAGE_DRIVER, root=self.graph_root, run=s / "run")
        _write_if_changed(s / "storage.conf", storage)

    def _conmon_env(self) -> dict[str, str]:
        """conmon's environment: podman's default PATH plus this store's configuration."""
        return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                **self.environ()}  # fmt: skip

    def containers(self) -> list[str]:
        """Names of every container in this store."""
        return self.run("ps", "--all", "--format", "{{.Names}}").split()

    def mounts(self) -> list[Path]:
        """Mount points under the state directory (container roots, shm), deepest first."""
        root = os.path.realpath(self.state_dir)
        found = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].encode().decode("unicode_escape")
            if point == root or point.startswith(root + "/"):
                found.append(Path(point))
        return sorted(found, key=lambda p: len(p.parts), reverse=True)

    def purge(self) -> None:
        """Remove every container, unmount what is left and delete the whole state directory."""
        if find_binary(self.podman) is not None and self.state_dir.exists():
            with contextlib.suppress(PodmanError):
                self.run("rm", "--all", "--force", "--time=0")
        for point in self.mounts():
            subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def versions(self) -> dict[str, str]:
        """podman's, conmon's and the OCI runtime's versions (first line each)."""
        return {
            "podman_version": self.run("version", "--format", "{{.Client.Version}}").strip(),
            "conmon_version": _first_line([find_binary("conmon") or "conmon", "--version"]),
            "runtime_version": _first_line([self.runtime_path(), "--version"]),
        }


def _first_line(argv: list[str]) -> str:
    """The first line of a tool's output ('' if it cannot run)."""
    try:
        out = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out.stdout or out.stderr).strip().split("\n")[0]


def _write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` unless it already holds exactly that."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
