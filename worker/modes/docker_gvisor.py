"""The ``docker-gvisor`` mode: the docker mode with gVisor's runsc as the container's runtime.

The way most deployments run gVisor: runsc registered as a runtime of the (private) dockerd
(``--add-runtime=runsc=...``, see ``worker.dockerd``) and asked for per container
(``--runtime=runsc``). The image, mounts, quota, cgroup parent, client and cleanup are the
docker mode's, so docker against docker-gvisor isolates gVisor's cost. runsc runs here with
cgroups on (as docker asks): it creates the container's cgroup under the environment's with the
container's limits, so the sandbox (Sentry) and gofer are inside the quota.

runsc is started by docker's runc shim with runsc's defaults: the ptrace platform on Debian 12's
release, no overlay on the bind mounts (the workspace's writes reach the host).
"""

from __future__ import annotations

from worker.dockerd import RUNSC_RUNTIME
from worker.modes.base import HostInfo, Preflight
from worker.modes.docker import DockerMode
from worker.modes.gvisor import INSTALL_FIX, runsc_path, runsc_version


class DockerGvisorMode(DockerMode):
    """``docker-gvisor``: a docker-mode container whose runtime is runsc."""

    name = "docker-gvisor"
    runtime = RUNSC_RUNTIME
    # gVisor's clock counts a throttled thread as running (see the gvisor mode).
    reported_cpu_floor = 0.1

    def preflight(self, host: HostInfo) -> Preflight:
        """runsc installed and registered with the private daemon; then the docker preflight."""
        runsc = runsc_path()
        if runsc is None:
            return Preflight(False, f"runsc (gVisor) is not installed: {INSTALL_FIX}")
        verdict = super().preflight(host)
        if not verdict.ok:
            return verdict
        runtimes = self.daemon.status().get("runtimes") or []
        if RUNSC_RUNTIME not in runtimes:
            return Preflight(False, (
                f"the private dockerd has no runtime {RUNSC_RUNTIME} (runtimes: "
                f"{', '.join(runtimes)}): it started before runsc was installed; restart it "
                "(sandbench host docker stop)"
            ), verdict.facts)  # fmt: skip
        facts = {**verdict.facts, "runtime": RUNSC_RUNTIME, "runsc": runsc_version(runsc),
                 "runsc_path": runsc, "ready_includes": "container and sandbox start "
                 "(docker start -ai, runsc)"}  # fmt: skip
        return Preflight(True, "", facts)
