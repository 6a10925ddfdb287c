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

from typing import Any

from worker.cgroups import remove_dir
from worker.dockerd import Dockerd, DockerdError
from worker.modes.base import EnvContext, HostInfo, Preflight
from worker.modes.container import (
    LABEL_KEY,
    WORKSPACE_IN,
    ContainerMode,
    container_binds,
    container_name,
    image_tag,
    import_image,
    payload_in,
    unmanaged_cgroup_dirs,
)

# Room in the environment's memory cgroup for the docker client (~11 MB resident) beside the
# container, whose own limit equals the quota and so is the one that binds.
CLIENT_MEMORY_BYTES = 64 * 1024 * 1024
# what the client sends empty (the daemon would store null): the same inspect output either way
CLIENT_EMPTY: dict[str, Any] = {
    "BlkioWeightDevice": [], "Devices": [], "Dns": [], "DnsOptions": [], "DnsSearch": [],
    "PortBindings": {}, "ConsoleSize": [0, 0],
}  # fmt: skip


def ensure_image(daemon: Dockerd) -> dict[str, Any]:
    """Import the host-toolset image into ``daemon`` unless present; its id and build note."""
    return import_image(daemon, image_tag(), "docker")


def create_body(env: EnvContext, image: str, runtime: str | None = None) -> dict[str, Any]:
    """The environment's container as the Engine API's ``ContainerCreate`` takes it: what
    ``docker create --interactive --network=none --log-driver=none --cgroup-parent=...
    --cpus --cpuset-cpus --memory --memory-swap --mount... --workdir IMAGE ARGV`` sends
    (``tests/test_docker_mode.py`` compares the two containers' inspect output). ``runtime``:
    an OCI runtime registered with the daemon, e.g. runsc; default the daemon's own, runc."""
    quota = env.spec.quota
    mounts = [{"Type": "bind", "Source": str(src), "Target": dst, "ReadOnly": ro}
              for src, dst, ro in container_binds(env)]  # fmt: skip
    host = {
        "NetworkMode": "none",
        "LogConfig": {"Type": "none", "Config": {}},
        "CgroupParent": env.cgroup_path,
        "NanoCpus": round(quota.cpu_quota * 1e9),
        "CpusetCpus": quota.cpus,
        "Memory": quota.memory_bytes,
        "MemorySwap": quota.memory_bytes + quota.swap_bytes,
        "Mounts": mounts,
        "RestartPolicy": {"Name": "no"},
        **({"Runtime": runtime} if runtime else {}),
        **CLIENT_EMPTY,
    }
    return {
        "Image": image,
        "Cmd": env.payload_argv(WORKSPACE_IN, payload_in(env)),
        "WorkingDir": WORKSPACE_IN,
        "Labels": {LABEL_KEY: env.spec.key()},
        "AttachStdin": True, "AttachStdout": True, "AttachStderr": True,
        "OpenStdin": True, "StdinOnce": True, "Tty": False,
        "HostConfig": host,
        "NetworkingConfig": {"EndpointsConfig": {"none": {}}},
    }  # fmt: skip


class DockerMode(ContainerMode):
    """Payload in a container of the private dockerd, host toolset, quota on the container."""

    name = "docker"
    cgroup_overhead_bytes = CLIENT_MEMORY_BYTES
    runtime: str | None = None  # the daemon's default OCI runtime (runc)

    def __init__(self, daemon: Dockerd | None = None) -> None:
        self.daemon = daemon or Dockerd()
        super().__init__(self.daemon)

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

    def _image_usable(self) -> bool:
        """A daemon that stopped may have lost nothing, but is asked again."""
        return self.daemon.ping()

    def prepare(self, env: EnvContext) -> None:
        """Not timed: daemon up, image present, container created (not started)."""
        self.daemon.ensure()
        image = self._ensure_image()
        self._remove(container_name(env))  # a stale container of a crashed attempt
        env.state["container"] = container_name(env)
        body = create_body(env, image["image_id"], self.runtime)
        env.state["container_id"] = self.daemon.create_container(container_name(env), body)
        env.state["image_id"] = image["image_id"]

    def launcher(self, env: EnvContext) -> list[str]:
        """``docker start -ai``: attach stdin/stdout, start the container, wait for its exit."""
        return self.daemon.client("start", "--attach", "--interactive", container_name(env))

    def cleanup(self, env: EnvContext) -> None:
        """Kill and remove the container (``docker rm -f``), then runc's extra cgroup dirs."""
        if self.daemon.ping():  # no daemon, no container
            self._remove(container_name(env))
        for directory in unmanaged_cgroup_dirs(env.cgroup_path):
            remove_dir(directory)

    def _remove(self, name: str) -> None:
        """``docker rm -f`` (through the Engine API) until the daemon no longer has it."""
        self.daemon.remove_container(name)

    def engine_oom_flag(self, env: EnvContext) -> bool:
        """The daemon's OOM flag of the container, through the Engine API."""
        found = self.daemon.container(container_name(env))
        return bool(found and (found.get("State") or {}).get("OOMKilled"))
