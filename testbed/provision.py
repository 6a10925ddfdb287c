"""Provisioning a lab as the README's "Fleet" section says (``ops/lab.sh provision``).

The last host of the lab is the broker and the coordinator, every other host a worker. Each step
is the README's own command, run on the guest over SSH, offline: ``install.sh --wheels`` from the
wheelhouse in the lab's share (``/media/lab/wheels``), with the system packages this machine's
root already has. The files that travel between hosts (the broker password, the coordinator's
public key) are copied through this machine, as ``scp`` would, and each worker's key is
registered on the coordinator with the ``sandbench hosts add`` line its install printed.
"""

from __future__ import annotations

import re
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from contract.errors import LabError
from testbed.lab import REPO, Lab

INSTALL = f"{REPO}/ops/install.sh"
WHEELS = "/media/lab/wheels"  # the lab share, as a USB stick with the wheelhouse would be
ETC = "/etc/sandbench"
INSTALL_TIMEOUT_S = 1800.0  # a venv from wheels under TCG
ADD_LINE = re.compile(r"^\s*(sandbench hosts add (\S+) (\S+))\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Fleet:
    """A provisioned lab: who is the broker and coordinator, who works, and the broker URL."""

    coordinator: str
    workers: tuple[str, ...]
    broker_url: str  # without its password, as --broker takes it
    seconds: dict[str, float]  # each step's wall time, for the README's costs


def install(lab: Lab, name: str, args: str) -> str:
    """``install.sh ARGS --wheels ...`` on host ``name``; its output."""
    line = f"{INSTALL} {args} --wheels {WHEELS} 2>&1"
    return lab.run(name, line, timeout=INSTALL_TIMEOUT_S).stdout


def provision(lab: Lab) -> Fleet:
    """Broker and coordinator on the last host, workers on the others, keys registered."""
    if len(lab.hosts) < 2:
        raise LabError("a fleet lab needs 2 hosts or more (the last is broker and coordinator)")
    seconds: dict[str, float] = {}
    coordinator = lab.hosts[-1]
    workers = tuple(h.name for h in lab.hosts[:-1])
    url = f"redis://{coordinator.name}:6379/0"

    def timed(step: str, name: str, args: str) -> str:
        started = time.monotonic()
        out = install(lab, name, args)
        seconds[step] = round(time.monotonic() - started, 1)
        return out

    timed("broker", coordinator.name, f"--role broker --bind {coordinator.address}")
    timed("coordinator", coordinator.name,
          f"--role coordinator --broker {url} --password-file {ETC}/broker.password")  # fmt: skip
    password = lab.run(coordinator.name, f"cat {ETC}/broker.password").stdout
    public = lab.run(coordinator.name, f"cat {ETC}/coordinator.pub").stdout

    def worker(name: str) -> str:
        lab.put(name, "/root/broker.password", password, 0o600)
        lab.put(name, "/root/coordinator.pub", public)
        return timed(f"worker {name}", name,
                     f"--role worker --host {name} --broker {url} --password-file "
                     "/root/broker.password --coordinator-key /root/coordinator.pub")  # fmt: skip

    with ThreadPoolExecutor(len(workers)) as pool:
        outputs = dict(zip(workers, pool.map(worker, workers), strict=True))
    for name, out in outputs.items():
        found = [m for m in ADD_LINE.finditer(out) if m.group(2) == name]
        if not found:
            raise LabError(f"{name}: install.sh printed no `sandbench hosts add {name}`:\n{out}")
        lab.run(coordinator.name, "sandbench " + shlex.join(found[-1].group(1).split()[1:]))
    return Fleet(coordinator.name, workers, url, seconds)
