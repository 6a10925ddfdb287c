"""The payload's body: one JSON line protocol on stdin/stdout, the rounds and their checks.

``workloads/payload.py`` (the launched bootstrap) has already written the ready line when it
imports this module; everything here, and the workload modules it loads, is imported after
Ready and before the answer to ``check 0``, outside every clock. Standard library only, and
only what the workload needs: the payload does not import the catalog (every family and what
each imports) but the family the host names (``--family``), or without it the families one at
a time until one declares its workload, and what that workload's rounds import (``preload``).
"""

from __future__ import annotations

import os
import resource
import sys

from workloads import jsonline
from workloads.kit import (
    CALIBRATION,
    FAMILIES,
    MAX_ROUNDS,
    Declaration,
    PayloadError,
    forget_prepared,
)

TYPE_CHECKING = False  # ``typing`` is not imported at run time (``workloads.kit``)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

    from workloads.kit import Check


def find_declared(name: str, family: str | None = None) -> Declaration:
    """The declaration of workload (or calibration) ``name``, importing its family only when
    ``family`` names it (the host passes ``--family``), else the families in order until one
    declares it; PayloadError if none declares it."""
    if family is not None and family not in (CALIBRATION, *FAMILIES):
        raise PayloadError(f"unknown family {family!r}: one of {(CALIBRATION, *FAMILIES)}")
    for each in (CALIBRATION, *FAMILIES) if family is None else (family,):
        module = __import__(f"workloads.{each}", fromlist=["DECLARED"])
        for declared in module.DECLARED:
            if declared.name == name:
                return declared  # type: ignore[no-any-return] # a family's DECLARED
    raise PayloadError(f"unknown workload {name!r}")


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its waited-for children so far."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return round(own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime, 6)


def parse_args(argv: list[str]) -> tuple[str, int, float, str, str | None]:
    """``--workload W --seed N --scale S --root DIR`` (all four required) ``[--family F]``
    (the module that declares W: the payload then imports that one alone)."""
    required = ("--workload", "--seed", "--scale", "--root")
    opts: dict[str, str] = {}
    it = iter(argv)
    for flag in it:
        if flag not in (*required, "--family") or flag in opts:
            raise PayloadError(f"unexpected argument {flag!r}")
        opts[flag] = next(it, "")
    missing = [f for f in required if not opts.get(f)]
    if missing:
        raise PayloadError(f"missing argument(s): {' '.join(missing)}")
    try:
        seed, scale = int(opts["--seed"]), float(opts["--scale"])
    except ValueError as exc:
        raise PayloadError(f"bad --seed or --scale: {exc}") from None
    if not os.path.isdir(opts["--root"]):
        raise PayloadError(f"--root {opts['--root']!r} is not a directory")
    return opts["--workload"], seed, scale, opts["--root"], opts.get("--family")


class Session:
    """One payload run: the protocol channel, the workload and the round counter.

    ``round k`` -> work and in-environment sync -> ``done k`` (digest; ``validated`` when the
    check was immediate). ``check k`` (after the host stopped the round clock) -> the round's
    read-back check -> round k+1's inputs generated (not after the last round: the host sends
    ``next: false``) -> ``checked k`` (digest, validated); ``check 0`` right after ready generates
    round 1's. A round may follow without a check.
    """

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.k: int | None = None  # the round being answered (None before the first)
        self.done = 0  # rounds completed
        self.pending: tuple[str, bool] | Check | None = None  # round ``done``'s result

    def send(self, message: dict[str, Any]) -> None:
        """Write one protocol line and flush it."""
        self.channel.write(jsonline.dumps(message) + "\n")
        self.channel.flush()

    def serve(self, argv: list[str], lines: Any) -> int:
        """Answer round and exit requests until exit (0) or an error (1)."""
        try:
            name, seed, scale, root, family = parse_args(argv)
            workload = find_declared(name, family)
            for module in workload.preload:  # what its rounds import: never inside a clock
                __import__(module)
            p = workload.scaled(scale)
            inputs = workload.inputs or (lambda seed, p, k: None)
            for line in lines:
                msg = jsonline.loads(line) if line.strip() else {"op": "noop"}
                if msg.get("op") == "exit":
                    return 0
                if msg.get("op") == "round":
                    self.round(msg.get("k"), lambda k: workload.round(root, seed, p, k))
                elif msg.get("op") == "check":
                    more = msg.get("next", True) is not False
                    self.check(msg.get("k"), lambda k: inputs(seed, p, k), more=more)
                elif msg.get("op") != "noop":
                    raise PayloadError(f"unknown request {line.strip()!r}")
            raise PayloadError("stdin closed before exit")
        except Exception as exc:  # noqa: BLE001 -- the runner gets the error as a message
            self.send({"op": "error", "k": self.k, "message": f"{type(exc).__name__}: {exc}"})
            return 1

    def round(self, k: Any, work: Callable[[int], tuple[str, bool] | Check]) -> None:
        """Run round ``k`` if it is the next one, and answer done."""
        self.k = k
        if k != self.done + 1 or not isinstance(k, int):
            raise PayloadError(f"round {k!r} out of order: expected round {self.done + 1}")
        if k > MAX_ROUNDS:
            raise PayloadError(f"round {k} > {MAX_ROUNDS}, the rounds fixtures prepare")
        self.pending = result = work(k)
        cpu_s = cpu_seconds()  # the host checks its cgroup saw at least this much
        if isinstance(result, tuple):
            self.send({"op": "done", "k": k, "digest": result[0], "validated": bool(result[1]),
                       "cpu_s": cpu_s})  # fmt: skip
        else:  # the read-back check waits for ``check k``
            self.send({"op": "done", "k": k, "digest": None, "validated": None, "cpu_s": cpu_s})
        self.done = k

    def check(self, k: Any, prepare: Callable[[int], None], *, more: bool = True) -> None:
        """Check round ``k`` (the last one done; 0: none yet), then prepare round k+1's inputs
        unless the host said no round follows (``next: false``: the last check)."""
        self.k = k
        if k != self.done or not isinstance(k, int):
            raise PayloadError(f"check of round {k!r}: the last round done is {self.done}")
        pending = self.pending
        result = pending if pending is None or isinstance(pending, tuple) else pending()
        digest, ok = result if result is not None else (None, k == 0)
        self.pending = None
        forget_prepared()
        if more and k < MAX_ROUNDS:
            prepare(k + 1)
        self.send({"op": "checked", "k": k, "digest": digest, "validated": bool(ok)})


def main() -> NoReturn:
    """Run the protocol on stdin/stdout (anything else written to fd 1 goes to stderr), then
    leave with its status at once.

    Every answer is flushed as it is sent and the workloads write through file descriptors or
    closed files, so what the interpreter's own shutdown would do (tear down every module,
    collect garbage: 2-4 ms here, tens of ms in a TCG guest) is none of the workload's; the
    launcher's exit, which the harness waits for after the last clock, comes that much sooner.
    """
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    status = Session(channel).serve(sys.argv[1:], sys.stdin)
    channel.flush()
    sys.stderr.flush()
    os._exit(status)
