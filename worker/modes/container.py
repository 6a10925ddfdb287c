"""What the container modes share: the image of empty mount points, mounts, quota, the engine.

docker, docker-gvisor and podman run one container layout: an image root of empty mount points
imported from a tar (no registry; built in preflight, never timed), the host's system
directories bound read-only as the toolset, the workspace and the payload's directory bound in,
no network, the quota as the container's own limits and its cgroup under the environment's
(``--cgroup-parent``). A mode on ``ContainerMode`` says only how its engine is reached.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path
from typing import Any, Protocol

from contract.records import Quota
from worker.cgroups import cgroup_mounts, detect
from worker.cgroups.base import oom_kill_logged
from worker.cgroups.v1 import CONTROLLERS
from worker.modes.base import EnvContext, Mode
from workloads.drive import PAYLOAD_PYTHON

IMAGE_MESSAGE = "sandbench: empty mount points; toolset = host dirs bound read-only"


# The host's system directories: the container's whole toolset, read-only.
TOOLSET_DIRS = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc")
# Mount points and scratch directories of the image root (all empty).
IMAGE_DIRS = (*TOOLSET_DIRS, "/tmp", "/root", "/proc", "/dev", "/sys", "/ws", "/sandbench")
IMAGE_REPO = "sandbench/hosttools"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
WORKSPACE_IN = "/ws"  # the workspace as the payload sees it
PAYLOAD_DIR_IN = "/sandbench/workloads"  # the payload's directory, bound read-only
LABEL_KEY = "sandbench.env"
CONTAINER_PREFIX = "sandbench-"
# Shell run once in a container at preflight: the tool versions this mode really runs.
TOOLS_PROBE = (
    f'echo "python3=$({PAYLOAD_PYTHON} -I -S -c "import sys; print(sys.version.split()[0])")"; '
    'echo "git=$(git --version | cut -d" " -f3)"; '
    'echo "gcc=$(gcc -dumpfullversion)"; '
    'echo "make=$(make --version | head -n1 | cut -d" " -f3)"'
)


class Engine(Protocol):
    """A container engine's client as the modes drive it: one command, its stdout."""

    def run(self, *args: str, input: bytes | None = None, timeout: float = ...) -> str:
        """Run one engine command; its stdout, or the engine's ``ModeUnavailable``."""
        ...


def image_tag() -> str:
    """The image's tag: a digest of its layout, so a changed layout builds a new image."""
    layout = "\n".join([*IMAGE_DIRS, IMAGE_PATH]).encode()
    return f"{IMAGE_REPO}:{hashlib.sha256(layout).hexdigest()[:12]}"


def image_root_tar() -> bytes:
    """A tar of the image root: empty directories only (mount points, /tmp sticky)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in IMAGE_DIRS:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if path == "/tmp" else 0o755
            tar.addfile(info)
    return buf.getvalue()


def toolset_binds() -> list[tuple[str, str, bool]]:
    """(source, target, read-only) of the host's system directories, bound read-only."""
    return [(d, d, True) for d in TOOLSET_DIRS if os.path.exists(d)]


def mount_options(binds: list[tuple[str, str, bool]]) -> list[str]:
    """``--mount`` options of ``binds`` (source, target, read-only)."""
    return [f"--mount=type=bind,src={src},dst={dst}{',readonly' if ro else ''}"
            for src, dst, ro in binds]  # fmt: skip


def toolset_mounts() -> list[str]:
    """``--mount`` options binding the host's system directories read-only."""
    return mount_options(toolset_binds())


def quota_options(quota: Quota) -> list[str]:
    """The container's own resource limits, equal to the environment's quota (no swap)."""
    return [
        f"--cpus={quota.cpu_quota:g}",
        f"--cpuset-cpus={quota.cpus}",
        f"--memory={quota.memory_bytes}",
        f"--memory-swap={quota.memory_bytes + quota.swap_bytes}",
    ]


def unmanaged_cgroup_dirs(cgroup_path: str) -> list[Path]:
    """The environment's cgroup directories in hierarchies the runner does not manage.

    runc creates the container's cgroup under ``--cgroup-parent`` in every hierarchy (blkio,
    devices, the named systemd one, a hybrid host's empty cgroup2), so the parent directories
    it made there are this mode's to remove; the runner removes its own.
    """
    mounts = cgroup_mounts()
    managed = CONTROLLERS if detect() == 1 else ("cgroup2",)
    managed_points = {mounts[name] for name in managed if name in mounts}
    points = set(mounts.values()) - managed_points
    rel = cgroup_path.strip("/")
    return [point / rel for point in sorted(points) if rel and (point / rel).is_dir()]


def container_binds(env: EnvContext) -> list[tuple[str, str, bool]]:
    """(source, target, read-only) of an environment's container: toolset, workspace, payload."""
    return [
        *toolset_binds(),
        (str(env.workspace), WORKSPACE_IN, False),
        (str(env.payload_dir), PAYLOAD_DIR_IN, True),
    ]


def container_mounts(env: EnvContext) -> list[str]:
    """``--mount`` options of an environment's container (``container_binds``)."""
    return mount_options(container_binds(env))


def payload_in(env: EnvContext) -> str:
    """The payload's path inside the container (its directory is bound at PAYLOAD_DIR_IN)."""
    return f"{PAYLOAD_DIR_IN}/{env.payload.name}"


def container_name(env: EnvContext) -> str:
    """A name unique to this environment (its private directory), valid for docker."""
    digest = hashlib.sha256(f"{env.spec.key()}\0{env.env_dir}".encode()).hexdigest()[:16]
    return CONTAINER_PREFIX + digest


def create_argv(env: EnvContext, image: str) -> list[str]:
    """``docker create`` arguments of the environment's container."""
    return [
        "create", "--interactive", f"--name={container_name(env)}",
        f"--label={LABEL_KEY}={env.spec.key()}",
        "--network=none", "--log-driver=none", f"--cgroup-parent={env.cgroup_path}",
        *quota_options(env.spec.quota), *container_mounts(env), f"--workdir={WORKSPACE_IN}",
        image,
        *env.payload_argv(WORKSPACE_IN, payload_in(env)),
    ]  # fmt: skip


def import_image(engine: Engine, tag: str, engine_name: str) -> dict[str, Any]:
    """Import the host-toolset image as ``tag`` unless present; its id and how it was built."""
    built_now = False
    try:
        image_id = engine.run("image", "inspect", "--format", "{{.Id}}", tag).strip()
    except Exception:  # noqa: BLE001 -- the engine's own error: the image is not there yet
        engine.run(
            "import", "--change", f"ENV PATH={IMAGE_PATH}", "--message", IMAGE_MESSAGE, "-", tag,
            input=image_root_tar(),
        )  # fmt: skip
        image_id = engine.run("image", "inspect", "--format", "{{.Id}}", tag).strip()
        built_now = True
    return {
        "image": tag,
        "image_id": image_id,
        "image_built_now": built_now,
        "image_build": (
            f"{engine_name} import of empty mount points; host {' '.join(TOOLSET_DIRS)} bound "
            "read-only"
        ),
    }


def parse_tools(out: str) -> dict[str, str]:
    """The ``name=version`` lines of ``TOOLS_PROBE``'s output."""
    pairs = (line.split("=", 1) for line in out.splitlines() if "=" in line)
    return dict(pairs)


class ContainerMode(Mode):
    """A mode whose payload runs in a container of ``engine``: image, tools and OOM verdict."""

    engine_name = "docker"  # the engine's name in the image's build note

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._image: dict[str, Any] | None = None
        self._tools: dict[str, str] | None = None

    def image_name(self) -> str:
        """The image's name in this engine (default: the layout's tag)."""
        return image_tag()

    def _ensure_image(self) -> dict[str, Any]:
        """The image facts, importing it the first time."""
        if self._image is None or not self._image_usable():
            self._image = import_image(self.engine, self.image_name(), self.engine_name)
        return self._image

    def _image_usable(self) -> bool:
        """Whether the cached image facts still hold (default: yes; a daemon may restart)."""
        return True

    def _tool_versions(self, image: str) -> dict[str, str]:
        """Versions of the tools as they run inside a container of this mode (probed once)."""
        if self._tools is None:
            self._tools = parse_tools(self._probe(image))
        return self._tools

    def _probe(self, image: str) -> str:
        """Run ``TOOLS_PROBE`` once in a container of ``image``; its output."""
        return self.engine.run(
            "run", "--rm", "--network=none", "--log-driver=none", *toolset_mounts(),
            image, "/bin/sh", "-c", TOOLS_PROBE,
        )  # fmt: skip

    def oom_killed(self, env: EnvContext) -> bool:
        """Whether a process of the container was OOM-killed, read before cleanup removes it.

        The environment's cgroup cannot show it: cgroup v1 counts a kill only in the victim's
        own memory cgroup, the container's, which the runtime removes when the container stops.
        The kernel's log names the victim's memory cgroup, below the environment's, for every
        kill: the payload's and a child's (a compiler) alike. The engine's flag
        (``engine_oom_flag``) covers only the container's first process and costs a request
        (a ``podman inspect``: 40 ms, between the drive and the oracle): it is asked only where
        the kernel's log cannot be read.
        """
        logged = oom_kill_logged(env.cgroup_path)
        return self.engine_oom_flag(env) if logged is None else logged

    def engine_oom_flag(self, env: EnvContext) -> bool:
        """The engine's own OOM flag of the container (``State.OOMKilled``)."""
        out = self.engine.run("inspect", "--format", "{{.State.OOMKilled}}", container_name(env))
        return out.strip() == "true"
