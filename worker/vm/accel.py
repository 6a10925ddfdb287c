"""The VM modes' accelerator on this host: KVM if a bounded probe boot gets Ready, else TCG.

The verdict is cached per host (keyed by host kernel, QEMU version, guest kernel and whether
/dev/kvm exists) in the prepared guest's directory, so only the first preflight pays the probe.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import selectors
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from worker.vm import qemu
from worker.vm.guest import Guest
from worker.vm.job import Job

CACHE_FILE = "accel.json"
KVM_PROBE_S = 20.0  # KVM boots in ~1 s; TCG here takes ~7-10 s, so a hung KVM guest shows quickly
TCG_PROBE_S = 180.0  # generous: the machine is shared
READY_PREFIX = b'{"op": "ready"'


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of one bounded probe boot."""

    accel: str
    ready: bool
    seconds: float
    detail: str


def _cache_key(guest: Guest) -> dict[str, object]:
    """What the verdict depends on; a change of any of these re-runs the probe."""
    return {
        "host_kernel": platform.release(),
        "qemu": qemu.qemu_version(),
        "guest_kernel": guest.kernel_version,
        "kvm_device": os.path.exists("/dev/kvm"),
    }


def _read_ready(proc: subprocess.Popen[bytes], bound_s: float) -> bool:
    """Whether the probe guest's ready line arrives on stdout within ``bound_s``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + bound_s
    buffer = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(left):
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                return False
            buffer += chunk
            if READY_PREFIX in buffer:
                return True
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the probe's whole process group and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def probe_boot(guest: Guest, accel: str, bound_s: float, machine: str = "q35") -> ProbeResult:
    """Boot the guest once with ``accel`` and wait at most ``bound_s`` for its ready line."""
    with tempfile.TemporaryDirectory(prefix="sandbench-vm-probe-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        job = Job(workspace="/", kind="none", probe=True).write(work / "job.sh")
        config = qemu.GuestConfig(
            kernel=guest.vmlinuz, initrd=guest.initrd, job=job,
            console_log=work / "console.log", machine=machine, accel=accel,
        )  # fmt: skip
        start = time.monotonic()
        # stdin stays an open pipe: on EOF QEMU's stdio chardev counts the host as gone and
        # drops what the guest writes to the port.
        proc = subprocess.Popen(
            qemu.launcher_argv(config),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            ready = _read_ready(proc, bound_s)
        finally:
            _stop(proc)
        seconds = time.monotonic() - start
        log = (work / "console.log").read_text(errors="replace")[-400:]
    detail = "ready" if ready else f"no ready line within {bound_s:.0f} s; console tail: {log!r}"
    return ProbeResult(accel=accel, ready=ready, seconds=round(seconds, 2), detail=detail)


def detect_accel(guest: Guest, refresh: bool = False) -> dict[str, object]:
    """The cached accelerator verdict for this host, probing (KVM first, then TCG) if needed."""
    cache = guest.home / CACHE_FILE
    key = _cache_key(guest)
    if not refresh and cache.exists():
        try:
            data: dict[str, object] = json.loads(cache.read_text())
            if data.get("key") == key:
                return data
        except ValueError:
            pass
    verdict = _probe_all(guest)
    verdict["key"] = key
    cache.write_text(json.dumps(verdict, indent=2) + "\n")
    return verdict


def probe_summary(verdict: dict[str, object]) -> str:
    """One line per probe boot of a verdict, e.g. ``kvm: no ready in 20 s; tcg: ready in 6.2 s``."""
    parts = []
    for probe in verdict.get("probes") or []:  # type: ignore[attr-defined]
        outcome = "ready" if probe["ready"] else "no ready"
        parts.append(f"{probe['accel']}: {outcome} in {probe['seconds']} s")
    return "; ".join(parts)


def _probe_all(guest: Guest) -> dict[str, object]:
    """Probe KVM (when /dev/kvm exists) with a short bound, then TCG; pick the first that works."""
    probes: list[ProbeResult] = []
    if os.access("/dev/kvm", os.R_OK | os.W_OK):
        probes.append(probe_boot(guest, "kvm", KVM_PROBE_S))
    if not (probes and probes[-1].ready):
        probes.append(probe_boot(guest, "tcg", TCG_PROBE_S))
    chosen = next((p for p in probes if p.ready), None)
    return {
        "accel": chosen.accel if chosen else None,
        "ready_s": chosen.seconds if chosen else None,
        "probes": [p.__dict__ for p in probes],
    }
