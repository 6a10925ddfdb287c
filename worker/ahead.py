"""The next environment prepared while the one before it is checked and cleaned up.

Most of a campaign's unmeasured time is preparation (the workspace's copy, the cgroup, a
container or guest, the staged snapshot), and it does not depend on the environment before it.
An executor that knows which environment comes next (the embedded run does; a fleet worker
takes one message at a time and prepares nothing ahead) starts that preparation on a thread as
soon as the current environment's launcher has exited (the runner's ``Following``), so it
overlaps only unmeasured work: the current environment's oracle, cleanup, signing and storing.
Nothing of it can reach a measurement: it starts after the drive, and the next environment's
``finish`` joins it (``take``) and writes the whole work root back (syncfs) before its marker.

What is prepared ahead is decided as the gate would decide it then: the spec must be admitted,
its mode's verdict ok, and the first-failure rule must not already skip it. The environment
whose drive just ended may still fail and so make the rule skip the prepared one: the gate then
discards it unmeasured (its cleanup) and records ``not-run`` as always.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from contract.errors import SpecRefused
from contract.records import EnvironmentSpec
from worker.gate import CellFailures, HostState, admit, for_this_host, skipped
from worker.runner import Prepared, prepare_environment

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """One preparation under way on its thread."""

    prepared: Prepared | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Ahead:
    """At most one environment prepared ahead, for one host's executor."""

    def __init__(self, host: HostState, failures: CellFailures, stop: threading.Event) -> None:
        self.host, self.failures, self.stop = host, failures, stop
        self._pending: _Pending | None = None

    def start(self, spec: EnvironmentSpec) -> None:
        """Start preparing ``spec`` on a thread, if the gate would run it now (never raises:
        whatever stops it here, the gate meets again in its turn and says)."""
        if self._pending is not None or self.stop.is_set():
            return
        try:
            admit(spec, self.host)
            spec = for_this_host(spec, self.host)
            verdict = self.host.preflight(spec)
            if skipped(spec, verdict, self.failures) is not None:
                return
        except (SpecRefused, OSError) as exc:
            log.info("not preparing %s ahead: %s", spec.key(), exc)
            return
        pending = _Pending()

        def prepare() -> None:
            try:
                pending.prepared = prepare_environment(
                    spec, host=self.host.info(), stop=self.stop, preflight=verdict,
                    models=self.host.models,
                )  # fmt: skip
            except Exception as exc:  # noqa: BLE001 -- bad input: the gate raises it in its turn
                log.info("not prepared ahead: %s: %s", spec.key(), exc)
            finally:
                pending.done.set()

        self._pending = pending
        threading.Thread(target=prepare, name=f"ahead {spec.key()}", daemon=True).start()

    def wait(self) -> None:
        """Until the preparation under way, if any, has ended (it stays pending)."""
        if (pending := self._pending) is not None:
            pending.done.wait()

    def ready(self) -> bool:
        """Whether no preparation is under way (never blocks)."""
        pending = self._pending
        return pending is None or pending.done.is_set()

    def spawn(self) -> None:
        """Start the launcher's shim of what was prepared ahead (``Following.spawn``: called
        on the thread that will drive it, once its preparation has ended)."""
        pending = self._pending
        if pending is not None and pending.done.is_set() and pending.prepared is not None:
            pending.prepared.start_shim()

    def take(self, spec: EnvironmentSpec) -> Prepared | None:
        """``spec``'s environment if it was prepared ahead (waiting for its preparation to end),
        with the seconds of it that overlapped what came before; else None (anything else
        prepared is discarded)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        taken = time.monotonic()
        pending.done.wait()
        prepared = pending.prepared
        if prepared is None:
            return None
        if prepared.key != spec.key():
            prepared.discard()
            return None
        prepared.overlapped_s = prepared.prepared_before(taken)
        return prepared

    def close(self) -> None:
        """Wait for what is being prepared and discard it (a stop, the end of a run)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.done.wait()
            if pending.prepared is not None:
                pending.prepared.discard()
