"""The ``podman`` mode: the payload in a daemonless OCI container (podman, conmon, runc or crun).

The container is the docker mode's: an image of empty mount points imported with ``podman
import`` (no registry, built in preflight, never timed), the host's system directories bound
read-only as the toolset, the workspace and the payload bound in, no network, the quota as the
container's own limits (``--cpus``, ``--cpuset-cpus``, ``--memory``, ``--memory-swap``; no pids
limit, as docker) and its cgroup under the environment's (``--cgroup-parent``). The store is
sandbench's own (``worker.podman``).

``prepare`` creates the container (not timed); the launcher is ``podman start --attach
--interactive``. From the marker, Ready covers podman's start, conmon, the OCI runtime's
container start (namespaces, mounts, cgroups) and the payload's interpreter start, up to its
ready line. podman has no daemon: the launcher and conmon (``--cgroups=no-conmon``) run in the
environment's cgroup, so its accounting, its kill and its empty-wait cover them, and the
cgroup leaves room for them (``cgroup_overhead_bytes``) beside the container, whose own limit
equals the quota and so is the one that binds.

OOM is podman's own verdict (``State.OOMKilled``), read before cleanup. podman 4.3 takes it from
the ``oom`` file conmon writes into its working directory, looked for in the container's bundle
directory: the launcher starts there (``env -C``, which also points podman at the store's
configuration).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from contract.records import Quota
from worker.cgroups import cgroup_mounts, remove_dir
from worker.cgroups import create as create_cgroup
from worker.modes.base import EnvContext, HostInfo, Preflight
from worker.modes.container import (
    LABEL_KEY,
    TOOLS_PROBE,
    WORKSPACE_IN,
    ContainerMode,
    container_mounts,
    container_name,
    image_tag,
    import_image,
    payload_in,
    quota_options,
    toolset_mounts,
    unmanaged_cgroup_dirs,
)
from worker.podman import Podman, PodmanError, find_binary, ulimit_options

MiB = 1024 * 1024
# Room in the environment's memory cgroup beside the container: the podman launcher (~35 MB
# resident here), conmon (~2 MB) and conmon's cleanup command (another podman) at its exit.
LAUNCHER_MEMORY_BYTES = 128 * MiB
LABELS = ("--label=sandbench=1",)  # every container sandbench creates, for a reaper to find
CONMON_PIDFILE = "conmon.pid"  # in the environment's directory, for a reaper to find
CONTAINER_PIDFILE = "container.pid"
LOCAL_REGISTRY = "localhost"  # where podman puts imported images
NAME_IN_USE = "is already in use"  # podman create's words for a name taken
REMOVE_WAIT_S = 30.0
REMOVE_POLL_S = 0.1


def ensure_image(store: Podman) -> dict[str, Any]:
    """Import the host-toolset image into ``store`` unless present; its id and build note."""
    # podman's name for it: no short-name resolution
    return import_image(store, f"{LOCAL_REGISTRY}/{image_tag()}", "podman")


def create_argv(env: EnvContext, image: str) -> list[str]:
    """``podman create`` arguments of the environment's container."""
    return [
        "create", "--interactive", f"--name={container_name(env)}",
        *LABELS, f"--label={LABEL_KEY}={env.spec.key()}",
        "--network=none", "--log-driver=none", "--pids-limit=-1",
        "--cgroups=no-conmon", f"--cgroup-parent={env.cgroup_path}",
        f"--conmon-pidfile={env.env_dir / CONMON_PIDFILE}",
        f"--pidfile={env.env_dir / CONTAINER_PIDFILE}",
        *ulimit_options(), *quota_options(env.spec.quota), *container_mounts(env),
        f"--workdir={WORKSPACE_IN}",
        image,
        *env.payload_argv(WORKSPACE_IN, payload_in(env)),
    ]  # fmt: skip


def leftover_cgroup_dirs(cgroup_path: str) -> list[Path]:
    """Directories the OCI runtime made for the environment: below its cgroup in every
    hierarchy (deepest first), then its own in hierarchies the runner does not manage."""
    rel = cgroup_path.strip("/")
    below = [
        path
        for point in sorted(set(cgroup_mounts().values()))
        if rel and (point / rel).is_dir()
        for path in (point / rel).rglob("*")
        if path.is_dir()
    ]
    below.sort(key=lambda path: len(path.parts), reverse=True)
    return below + unmanaged_cgroup_dirs(cgroup_path)


class PodmanMode(ContainerMode):
    """Payload in a podman container on sandbench's own store, quota on the container."""

    name = "podman"
    engine_name = "podman"
    cgroup_overhead_bytes = LAUNCHER_MEMORY_BYTES

    def __init__(self, store: Podman | None = None) -> None:
        self.store = store or Podman()
        super().__init__(self.store)

    def image_name(self) -> str:
        """podman's name for the image: fully qualified, so no short-name resolution."""
        return f"{LOCAL_REGISTRY}/{image_tag()}"

    def preflight(self, host: HostInfo) -> Preflight:
        """Set the store up and import the image; the reason if podman cannot run here."""
        try:
            self.store.setup()
            image = self._ensure_image()
            facts: dict[str, Any] = {
                **image,
                **self.store.versions(),
                "runtime": self.store.runtime_path(),
                "runtime_choice": self.store.runtime_reason,
                "state_dir": str(self.store.state_dir),
                "ulimits": ulimit_options(),
                "tools": self._tool_versions(image["image"]),
                "ready_includes": "container start (podman start --attach --interactive)",
            }
        except PodmanError as exc:
            return Preflight(False, str(exc))
        return Preflight(True, "", facts)

    def _probe(self, image: str) -> str:
        """``TOOLS_PROBE`` in a container placed as an environment's is: under a cgroup of its
        own, conmon staying with its caller (on v2 a parent cgroup may not hold processes)."""
        probe = create_cgroup(f"podman-preflight-{os.getpid()}", Quota())
        try:
            return self.store.run(
                "run", "--rm", "--network=none", "--log-driver=none", "--cgroups=no-conmon",
                f"--cgroup-parent={probe.path}", *ulimit_options(), *toolset_mounts(),
                image, "/bin/sh", "-c", TOOLS_PROBE,
            )  # fmt: skip
        finally:
            for directory in leftover_cgroup_dirs(probe.path):
                remove_dir(directory)
            probe.remove()

    def prepare(self, env: EnvContext) -> None:
        """Not timed: store and image ready, container created (not started)."""
        self.store.setup()
        image = self._ensure_image()
        name = container_name(env)
        env.state["container"] = name
        try:  # a podman command costs 30-40 ms: no check for a stale container before it
            created = self.store.run(*create_argv(env, image["image_id"]))
        except PodmanError as exc:
            if NAME_IN_USE not in str(exc):
                raise
            self._remove(name)  # a stale container of a crashed attempt
            created = self.store.run(*create_argv(env, image["image_id"]))
        env.state["container_id"] = container_id = created.strip()
        static = self.store.static_dir(container_id)  # a podman inspect costs another 35 ms
        if static is None:
            static = Path(self.store.run("inspect", "--format", "{{.StaticDir}}", name).strip())
        env.state["bundle"] = str(static)
        env.state["image_id"] = image["image_id"]

    def launcher(self, env: EnvContext) -> list[str]:
        """``podman start --attach --interactive``, started in the container's bundle dir."""
        bundle = Path(env.state["bundle"])
        return self.store.command(
            "start", "--attach", "--interactive", container_name(env), cwd=bundle
        )

    def cleanup(self, env: EnvContext) -> None:
        """Kill and remove the container (its storage too), then the runtime's cgroup dirs."""
        if find_binary(self.store.podman) is not None:  # no podman, no container
            self._remove(container_name(env))
        for directory in leftover_cgroup_dirs(env.cgroup_path):
            remove_dir(directory)

    def _remove(self, name: str) -> None:
        """``podman rm --force`` (a missing container is fine), retried while podman refuses."""
        deadline = time.monotonic() + REMOVE_WAIT_S
        while True:
            try:
                self.store.run("rm", "--force", "--time=0", "--ignore", name)
            except PodmanError as exc:  # e.g. conmon's cleanup holds the container's lock
                if time.monotonic() > deadline:
                    raise PodmanError(f"container {name} is not removed: {exc}") from exc
            else:
                return
            time.sleep(REMOVE_POLL_S)
