"""The ``docker`` mode: the payload in a container of the worker's private dockerd.

The image is a tiny root of empty mount points imported with ``docker import`` (no registry);
the toolset is the host's own system directories bind-mounted read-only, so the container runs
the same /usr/bin/python3, git, gcc and make as every other mode. Building the image is
preparation (preflight), never timed.

Ready includes container start: ``prepare`` creates the container (``docker create -i``, not
timed, like the other modes' preparation) and the launcher is ``docker start -ai``. From the
marker, Ready therefore covers the client's start, attach, the daemon's and runc's container
start (namespaces, mounts, cgroups) and the payload's interpreter start, up to its ready line.

The container's cgroup is placed under the environment's cgroup (``--cgroup-parent``), so the
runner's CPU and memory accounting and its kill see the container's processes; the container
also carries the quota itself (``--cpus``, ``--cpuset-cpus``, ``--memory``, ``--memory-swap``).
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
from pathlib import Path
from typing import Any

from tasks.records import Quota
from worker.cgroupsv1 import CONTROLLERS
from worker.dockerd import Dockerd, DockerdError
from worker.modes.base import PAYLOAD_PYTHON, EnvContext, HostInfo, Preflight
from worker.quota import cgroup_mounts, detect, remove_dir

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
# Room in the environment's memory cgroup for the docker client (~11 MB resident) beside the
# container, whose own limit equals the quota and so is the one that binds.
CLIENT_MEMORY_BYTES = 64 * 1024 * 1024
REMOVE_WAIT_S = 30.0
REMOVE_POLL_S = 0.1
# Shell run once in a container at preflight: the tool versions this mode really runs.
TOOLS_PROBE = (
    f'echo "python3=$({PAYLOAD_PYTHON} -I -S -c "import sys; print(sys.version.split()[0])")"; '
    'echo "git=$(git --version | cut -d" " -f3)"; '
    'echo "gcc=$(gcc -dumpfullversion)"; '
    'echo "make=$(make --version | head -n1 | cut -d" " -f3)"'
)


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


def ensure_image(daemon: Dockerd) -> dict[str, Any]:
    """Import the host-toolset image unless present; its id and how it was built."""
    tag = image_tag()
    built_now = False
    try:
        image_id = daemon.run("image", "inspect", "--format", "{{.Id}}", tag).strip()
    except DockerdError:
        daemon.run(
            "import",
            "--change", f"ENV PATH={IMAGE_PATH}",
            "--message", "sandbench: empty mount points; toolset = host dirs bound read-only",
            "-", tag,
            input=image_root_tar(),
        )  # fmt: skip
        image_id = daemon.run("image", "inspect", "--format", "{{.Id}}", tag).strip()
        built_now = True
    return {
        "image": tag,
        "image_id": image_id,
        "image_built_now": built_now,
        "image_build": (
            f"docker import of empty mount points; host {' '.join(TOOLSET_DIRS)} bound read-only"
        ),
    }


def toolset_mounts() -> list[str]:
    """``--mount`` options binding the host's system directories read-only."""
    return [
        f"--mount=type=bind,src={d},dst={d},readonly" for d in TOOLSET_DIRS if os.path.exists(d)
    ]


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


def container_mounts(env: EnvContext) -> list[str]:
    """``--mount`` options of an environment's container: toolset, workspace, payload."""
    return [
        *toolset_mounts(),
        f"--mount=type=bind,src={env.workspace},dst={WORKSPACE_IN}",
        f"--mount=type=bind,src={env.payload_dir},dst={PAYLOAD_DIR_IN},readonly",
    ]


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


class DockerMode:
    """Payload in a container of the private dockerd, host toolset, quota on the container."""

    name = "docker"
    staged = False
    cgroup_overhead_bytes = CLIENT_MEMORY_BYTES

    def __init__(self, daemon: Dockerd | None = None) -> None:
        self.daemon = daemon or Dockerd()
        self._image: dict[str, Any] | None = None
        self._tools: dict[str, str] | None = None

    def preflight(self, host: HostInfo) -> Preflight:
        """Start the private daemon on demand and build the image; the reason if either fails."""
        try:
            self.daemon.ensure()
            image = self._ensure_image()
            status = self.daemon.status()
            tools = self._tool_versions(image["image"])
        except DockerdError as exc:
            return Preflight(False, str(exc))
        facts: dict[str, Any] = {
            **image,
            "dockerd_version": status.get("version"),
            "docker_api": status.get("api_version"),
            "storage_driver": status.get("storage_driver"),
            "cgroup_driver": status.get("cgroup_driver"),
            "daemon_socket": status.get("socket"),
            "tools": tools,
            "ready_includes": "container start (docker start -ai)",
        }
        return Preflight(True, "", facts)

    def _ensure_image(self) -> dict[str, Any]:
        """The image facts, importing it the first time."""
        if self._image is None or not self.daemon.ping():
            self._image = ensure_image(self.daemon)
        return self._image

    def _tool_versions(self, image: str) -> dict[str, str]:
        """Versions of the tools as they run inside a container of this mode (probed once)."""
        if self._tools is None:
            out = self.daemon.run(
                "run", "--rm", "--network=none", "--log-driver=none", *toolset_mounts(),
                image, "/bin/sh", "-c", TOOLS_PROBE,
            )  # fmt: skip
            pairs = (line.split("=", 1) for line in out.splitlines() if "=" in line)
            self._tools = {k: v for k, v in pairs}
        return self._tools

    def prepare(self, env: EnvContext) -> None:
        """Not timed: daemon up, image present, container created (not started)."""
        self.daemon.ensure()
        image = self._ensure_image()
        self._remove(container_name(env))  # a stale container of a crashed attempt
        env.state["container"] = container_name(env)
        env.state["container_id"] = self.daemon.run(*create_argv(env, image["image_id"])).strip()
        env.state["image_id"] = image["image_id"]

    def launcher(self, env: EnvContext) -> list[str]:
        """``docker start -ai``: attach stdin/stdout, start the container, wait for its exit."""
        return self.daemon.client("start", "--attach", "--interactive", container_name(env))

    def oom_killed(self, env: EnvContext) -> bool:
        """Docker's own OOM verdict for the container, read before cleanup removes it.

        The environment's cgroup cannot show it: cgroup v1 counts a kill only in the victim's
        own memory cgroup, the container's, which docker removes when the container stops.
        """
        out = self.daemon.run("inspect", "--format", "{{.State.OOMKilled}}", container_name(env))
        return out.strip() == "true"

    def sync(self, env: EnvContext, round: int) -> None:
        """Nothing: the workspace is a bind mount; the payload's fsync reaches the host file."""

    def result_root(self, env: EnvContext) -> Path:
        """The host workspace, bind-mounted into the container."""
        return env.workspace

    def cleanup(self, env: EnvContext) -> None:
        """Kill and remove the container (``docker rm -f``), then runc's extra cgroup dirs."""
        if self.daemon.ping():  # no daemon, no container
            self._remove(container_name(env))
        for directory in unmanaged_cgroup_dirs(env.cgroup_path):
            remove_dir(directory)

    def _remove(self, name: str) -> None:
        """``docker rm -f`` until the daemon no longer lists the container."""
        deadline = time.monotonic() + REMOVE_WAIT_S
        while self._exists(name):
            try:
                self.daemon.run("rm", "--force", "--volumes", name)
                continue
            except DockerdError as exc:  # e.g. removal already in progress
                if time.monotonic() > deadline:
                    raise DockerdError(f"container {name} is not removed: {exc}") from exc
            time.sleep(REMOVE_POLL_S)

    def _exists(self, name: str) -> bool:
        """Whether the daemon lists a container called exactly ``name``."""
        out = self.daemon.run("ps", "--all", "--quiet", f"--filter=name=^{name}$")
        return bool(out.strip())
