"""The job file: what the guest init does in one environment (sourced by ``init.sh``)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

# 9p-mmap: reads and writes go straight to the host (no page cache); only shared mappings are
# cached, because 9p without any cache refuses writable shared mmap (mmap-write would fail).
# virtiofs: the "ws" tag of a vhost-user-fs device, served by virtiofsd on the host (its cache
# mode is the daemon's option, not the mount's).
WorkspaceKind = Literal["9p-mmap", "9p-loose", "virtiofs", "ext4", "none"]

# The payload's environment in the guest: the same tool paths as the host, nothing inherited.
GUEST_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
}


# Where the guest finds the payload's directory (payload.py and its body beside it): a
# read-only bind of the host's directory, made by the init before it mounts the guest's /tmp
# (which would hide a checkout under the host's /tmp).
GUEST_PAYLOAD_DIR = "/run/sandbench/workloads"


@dataclass
class Job:
    """One guest run: the workspace mount and the payload command."""

    workspace: str  # path of the workspace inside the guest
    kind: WorkspaceKind
    argv: list[str] = field(default_factory=list)  # runs the payload in GUEST_PAYLOAD_DIR
    payload_dir: str = ""  # the payload's directory on the host (seen through the host root)
    hold: bool = False  # test hook: never start the payload (a guest that never becomes ready)
    probe: bool = False  # only announce readiness and exit 0 (accelerator probe)

    def script(self) -> str:
        """The job as shell assignments for the init."""
        command = [f"{k}={v}" for k, v in GUEST_ENV.items()] + self.argv
        lines = {
            "WS_PATH": self.workspace,
            "WS_KIND": self.kind,
            "PAYLOAD": shlex.join(command),
            "PAYLOAD_DIR": self.payload_dir,
            "GUEST_PAYLOAD_DIR": GUEST_PAYLOAD_DIR,
            "HOLD": "1" if self.hold else "0",
            "PROBE": "1" if self.probe else "0",
        }
        return "".join(f"{k}={shlex.quote(v)}\n" for k, v in lines.items())

    def write(self, path: Path) -> Path:
        """Write the job file (readable by the guest through the read-only host root)."""
        path.write_text(self.script())
        path.chmod(0o644)
        return path
