"""``ops/lab.sh``: make, reach, cut and remove a lab of systemd hosts (``testbed.lab``), and
provision it (``testbed.provision``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from contract.errors import LabError
from testbed import lab as lab_module
from testbed.lab import (
    DEFAULT_DIR,
    DEFAULT_MEMORY_MIB,
    Lab,
    build_wheels,
    down,
    kill,
    start,
    up,
    wait_ready,
)
from testbed.provision import provision


def lab_doc() -> str:
    """The lab module's first paragraph, for --help."""
    return (lab_module.__doc__ or "").split("\n\n")[0]


def _offsets(values: list[str]) -> dict[str, int]:
    """``NAME=SECONDS`` pairs (``--clock-offset lab-b=3600``)."""
    out = {}
    for value in values:
        name, _, seconds = value.partition("=")
        try:
            out[name] = int(seconds)
        except ValueError:
            raise LabError(f"--clock-offset {value}: give NAME=SECONDS, e.g. lab-b=3600") from None
    return out


def parser() -> argparse.ArgumentParser:
    """``ops/lab.sh``'s arguments."""
    p = argparse.ArgumentParser(prog="ops/lab.sh", description=lab_doc())
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"default {DEFAULT_DIR}")
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser("up", help="make N lab hosts and boot them, then wait for each")
    u.add_argument("count", type=int)
    u.add_argument("--memory-mib", type=int, default=DEFAULT_MEMORY_MIB)
    u.add_argument("--clock-offset", action="append", default=[], metavar="NAME=SECONDS")
    u.add_argument("--no-wait", action="store_true")
    sub.add_parser("down", help="stop every host and remove the lab")
    sub.add_parser("status", help="each host: running or not, address, clock offset")
    s = sub.add_parser("ssh", help="a shell (or a command) on a host, as root")
    s.add_argument("name")
    s.add_argument("line", nargs=argparse.REMAINDER)
    k = sub.add_parser("kill", help="power cut: the host's QEMU killed at once")
    k.add_argument("name")
    b = sub.add_parser("start", help="boot a host again (after kill), then wait for it")
    b.add_argument("name")
    b.add_argument("--clock-offset", type=int, default=None, metavar="SECONDS")
    sub.add_parser("wheels", help="build the wheelhouse into the lab's share (needs PyPI)")
    sub.add_parser("provision", help="install.sh offline: the last host broker and coordinator, "
                   "the others workers, their keys registered")  # fmt: skip
    return p


def main(args: list[str] | None = None) -> int:
    """``ops/lab.sh COMMAND``: 0 when done, 2 with one line when it cannot."""
    ns = parser().parse_args(args)
    try:
        return _command(ns)
    except LabError as exc:
        print(f"ops/lab.sh: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _command(ns: argparse.Namespace) -> int:
    """One subcommand."""
    if ns.command == "up":
        lab = up(ns.dir, ns.count, ns.memory_mib, _offsets(ns.clock_offset))
        for host in lab.hosts:
            state = "booting" if ns.no_wait else wait_ready(lab, host.name)
            print(f"{host.name} {host.address} {state}")
    elif ns.command == "down":
        down(ns.dir)
    elif ns.command == "status":
        lab = Lab.load(ns.dir)
        for host in lab.hosts:
            running = "running" if lab.pid(host) else "stopped"
            print(f"{host.name} {host.address} {running} clock {host.clock_offset_s:+d} s")
    elif ns.command == "ssh":
        lab = Lab.load(ns.dir)
        line = " ".join(ns.line) if ns.line else None  # as ssh joins its words
        argv = lab.ssh_argv(ns.name, line, tty=line is None and sys.stdin.isatty())
        os.execvp("ip", argv)  # noqa: S606 -- the lab's ssh replaces this process
    elif ns.command == "kill":
        kill(Lab.load(ns.dir), ns.name)
    elif ns.command == "start":
        lab = Lab.load(ns.dir)
        start(lab, ns.name, ns.clock_offset)
        print(f"{ns.name} {wait_ready(lab, ns.name)}")
    elif ns.command == "wheels":
        print(build_wheels(Lab.load(ns.dir)))
    elif ns.command == "provision":
        fleet = provision(Lab.load(ns.dir))
        print(f"broker and coordinator {fleet.coordinator} ({fleet.broker_url}), "
              f"workers {' '.join(fleet.workers)}")  # fmt: skip
        for step, took in fleet.seconds.items():
            print(f"  {step}: {took:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
