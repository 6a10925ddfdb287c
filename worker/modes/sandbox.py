"""The bubblewrap sandbox mode, named ``host``: the root read-only, only the workspace writable.

Users see the name ``host`` (the reference study's light host sandbox); code and docs call it the
sandbox mode, never to be confused with a lab host. New mount, pid, ipc, uts and net namespaces;
the network namespace has only its own loopback, so nothing outside is reachable. There is no
writable scratch (not even ``/tmp``): the workloads keep their temporary files in the workspace
(the build sets ``TMPDIR``).
"""

from __future__ import annotations

import shutil
import subprocess

from worker.modes.base import EnvContext, HostInfo, Mode, Preflight
from worker.modes.native import python_version

BWRAP = "bwrap"
PROBE_TIMEOUT_S = 10.0
NAMESPACE_FLAGS = ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net")


def bwrap_argv(bwrap: str, workspace: str, payload_dir: str) -> list[str]:
    """The bubblewrap options of the sandbox mode for ``workspace`` (everything before ``--``)."""
    return [
        bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
        "--ro-bind", payload_dir, payload_dir, "--bind", workspace, workspace,
        *NAMESPACE_FLAGS, "--hostname", "sandbench", "--die-with-parent", "--new-session",
        "--chdir", workspace,
    ]  # fmt: skip


class SandboxMode(Mode):
    """The sandbox mode (named ``host``): bubblewrap around the same payload and toolset.

    bubblewrap builds the sandbox at launch (inside Ready, as in the study) and the sandbox
    dies with its processes: nothing to prepare, sync or clean up.
    """

    name = "host"

    def preflight(self, host: HostInfo) -> Preflight:
        """bubblewrap is installed and can create the namespaces here."""
        bwrap = shutil.which(BWRAP)
        if bwrap is None:
            return Preflight(False, "bubblewrap is not installed (apt-get install bubblewrap)")
        argv = [*bwrap_argv(bwrap, "/", "/"), "--", "/bin/true"]
        try:
            probe = subprocess.run(
                argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Preflight(False, f"bubblewrap probe failed: {exc}")
        if probe.returncode != 0:
            return Preflight(False, f"bubblewrap cannot create namespaces: {probe.stderr.strip()}")
        version = subprocess.run(
            [bwrap, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        return Preflight(True, facts={"bwrap": version, "python": python_version()})

    def launcher(self, env: EnvContext) -> list[str]:
        """bwrap, then the payload rooted at the workspace (same path inside as outside)."""
        bwrap = shutil.which(BWRAP) or BWRAP
        workspace = str(env.workspace)
        return [*bwrap_argv(bwrap, workspace, str(env.payload_dir)), "--",
                *env.payload_argv(workspace)]  # fmt: skip
