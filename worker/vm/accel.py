"""The VM modes' accelerator on this host: KVM if a bounded probe boot gets Ready, else TCG.

The verdict is cached per host (keyed by host kernel, QEMU version, guest kernel and whether
/dev/kvm exists) in the prepared guest's directory, so only the first preflight pays the probe.
A probe that fails says why: QEMU's own error when it exits (e.g. an MSR the host's KVM refuses),
or the console's tail when the guest hangs until the bound.
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
CACHE_FORMAT = 2  # 2: probes carry QEMU's stderr as the reason
STDERR_TAIL_CHARS = 400
EXIT_WAIT_S = 2.0  # after the probe's output ends, how long QEMU may take to exit
NO_KVM_DEVICE = (
    "no usable /dev/kvm: enable VT-x/AMD-V in the firmware, load kvm_intel or kvm_amd "
    "(modprobe), and run as a user who may open /dev/kvm"
)
KVM_PROBE_S = 20.0  # KVM boots in ~1 s; TCG here takes ~7-10 s, so a hung KVM guest shows quickly
TCG_PROBE_S = 180.0  # generous: the machine is shared
READY_PREFIX = b'{"op": "ready"'
_KVM_ONLY: dict[str, str | None] = {}  # this process's KVM-only probes, by guest and cache key


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
        "format": CACHE_FORMAT,
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


def _exit_status(proc: subprocess.Popen[bytes]) -> int | None:
    """QEMU's exit status if it has exited (its output ended), None if it still runs (hung)."""
    try:
        return proc.wait(timeout=EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        return None


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
        with open(work / "qemu.stderr", "wb") as stderr:
            proc = subprocess.Popen(
                qemu.qemu_argv(config),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                start_new_session=True,
            )  # fmt: skip
            try:
                ready = _read_ready(proc, bound_s)
                exited = None if ready else _exit_status(proc)
            finally:
                _stop(proc)
        seconds = round(time.monotonic() - start, 2)
        detail = "ready" if ready else _failure(work, exited, seconds, bound_s)
    return ProbeResult(accel=accel, ready=ready, seconds=seconds, detail=detail)


def _failure(work: Path, exited: int | None, seconds: float, bound_s: float) -> str:
    """Why a probe boot got no ready line: QEMU's exit and error, or the hung console's tail."""
    lines = (work / "qemu.stderr").read_text(errors="replace").split("\n")
    err = " | ".join(line.strip() for line in lines if line.strip())[-STDERR_TAIL_CHARS:]
    if exited is not None:
        how = f"was killed by {signal.Signals(-exited).name}" if exited < 0 else f"exited {exited}"
        return f"QEMU {how} after {seconds} s: {err or '(no message)'}"
    said = f"; QEMU said: {err}" if err else ""
    console = qemu.console_tail(work / "console.log") or "no console log"
    return f"no ready line within {bound_s:.0f} s (guest hung); {console}{said}"


def cached_verdict(guest: Guest) -> dict[str, object] | None:
    """The cached verdict if it is still valid for this host, without probing."""
    try:
        data: dict[str, object] = json.loads((guest.home / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("key") == _cache_key(guest) else None


def detect_accel(guest: Guest, refresh: bool = False) -> dict[str, object]:
    """The cached accelerator verdict for this host, probing (KVM first, then TCG) if needed."""
    cached = None if refresh else cached_verdict(guest)
    if cached is not None:
        return cached
    verdict = _probe_all(guest)
    verdict["key"] = _cache_key(guest)
    (guest.home / CACHE_FILE).write_text(json.dumps(verdict, indent=2) + "\n")
    return verdict


def kvm_problem(guest: Guest) -> str | None:
    """Why KVM cannot run the guest here (the probe's reason), or None if its probe got Ready.

    Uses the cached verdict; without one, only the KVM probe runs (bounded by KVM_PROBE_S), once
    per process.
    """
    verdict = cached_verdict(guest)
    if verdict is not None:
        kvm = next((p for p in _probes(verdict) if p["accel"] == "kvm"), None)
        if kvm is None:
            return NO_KVM_DEVICE
        return None if kvm["ready"] else f"the KVM probe boot failed: {kvm['detail']}"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return NO_KVM_DEVICE
    key = json.dumps([str(guest.home), _cache_key(guest)], sort_keys=True)
    if key not in _KVM_ONLY:  # a preflight and then a preparation ask: one bounded probe
        probe = probe_boot(guest, "kvm", KVM_PROBE_S)
        _KVM_ONLY[key] = None if probe.ready else f"the KVM probe boot failed: {probe.detail}"
    return _KVM_ONLY[key]


def fallback_reason(verdict: dict[str, object]) -> str | None:
    """Why the verdict is not KVM (for provenance and ``vm status``), or None if it is."""
    if verdict.get("accel") == "kvm":
        return None
    kvm = next((p for p in _probes(verdict) if p["accel"] == "kvm"), None)
    return str(kvm["detail"]) if kvm is not None else NO_KVM_DEVICE


def host_facts(guest: Guest | None) -> dict[str, object]:
    """The accelerator for the host's provenance, from the cached verdict (never probes)."""
    verdict = cached_verdict(guest) if guest is not None else None
    if verdict is None:
        return {"accel": None, "note": "not probed yet (sandbench vm prepare)"}
    return {"accel": verdict.get("accel"), "kvm_unusable": fallback_reason(verdict)}


def _probes(verdict: dict[str, object]) -> list[dict[str, object]]:
    """The probe boots of a verdict."""
    probes = verdict.get("probes")
    return list(probes) if isinstance(probes, list) else []


def probe_summary(verdict: dict[str, object]) -> str:
    """One line per probe boot of a verdict, e.g. ``kvm: no ready in 20 s; tcg: ready in 6.2 s``."""
    parts = []
    for probe in _probes(verdict):
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
