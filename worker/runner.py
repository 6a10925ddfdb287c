"""One environment, exactly as the measurement protocol defines it, turned into a record.

prepare (not timed) -> syncfs (so round 1 never flushes the workspace's copy) -> marker ->
Ready -> R rounds -> exit -> oracle -> cleanup. The runner owns the marker, the cgroup, the
channel, the clocks, the limit, the kill and the classification; the mode only prepares,
launches, syncs, names its result root and cleans up.

The preparation can run apart from the rest (``prepare_environment``, then
``Prepared.finish``): an executor that knows the next environment prepares it on a thread while
the previous one's oracle and cleanup run (``worker.ahead``). What keeps that out of every
measurement is here: ``Following.start`` is called only once the launcher has exited and its
leftovers are killed, and ``finish`` starts with the syncfs, so each environment's marker comes
after everything before it has finished and is written back. An environment's cleanup waits
for the preparation under way (``Following.wait``) before its own syncfs and its cgroup's
removal: a copy still dirtying the file system's shared metadata blocks (inode tables, bitmaps)
would keep pages charged to that cgroup dirty, and it would linger as a dying cgroup. Each
phase's monotonic span is in the record (``spans``), so a test can check that no preparation,
oracle or cleanup ever lay inside another environment's drive.

A benchmark failure is a record, never an exception: ``run_environment`` raises only for bad
input (unknown mode or workload) or a host that cannot run environments at all (no cgroups).
When ``stop`` is set (Ctrl-C) it kills the environment, cleans up and returns ``None``: no
record exists for that environment, so a resumed campaign runs it again from scratch.

Classification: the first failure decides, except that an OOM kill in the environment's
cgroup (even one the task survived) makes it ``oom``, and a full disk behind a failure makes
it ``no-space``. The limit is ``timeout`` wherever it is reached, and its detail names it
("limit of N s reached before Ready", "... in round k", "... in round k's sync"); a payload
that ends or writes something else before its ready line is ``no-ready``. A launcher that
cannot be spawned, or a shell template that exits 126/127 before Ready, is
``launcher-error``. When the launcher exits, whatever it left in the environment's cgroup is
killed at once and counted (``leftover_processes``); the outcome still follows the payload's
rounds, the exit status and the oracle. Only completed rounds are recorded, so a
failure never shows a round time of zero. The runner does not gate on the mode's preflight
(``worker.gate`` does); it records the preflight's verdict and facts in ``provenance``.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.errors import SandbenchError
from contract.records import REASONS, EnvironmentRecord, EnvironmentSpec, OracleResult, RoundRecord
from contract.stamps import utc_now
from worker import cgroups, containment, ledger, trash
from worker.bytecode import ensure_bytecode
from worker.channel import (
    Channel,
    ChannelClosed,
    ChannelError,
    ChannelStopped,
    ChannelTimeout,
    Message,
)
from worker.failure import LAUNCH_FAILURE_CODES, Failed, Stopped, os_reason, real_cause
from worker.modes import EnvContext, HostInfo, Mode, Preflight, get_mode
from worker.modes.base import PAYLOAD_PATH, STDERR_FILE
from worker.procs import Shim, close_pipes, kill_process, start_shim
from worker.snapshot import (
    APART_ENTRIES,
    Snapshot,
    fixture_snapshot,
    snapshot,
    snapshot_after,
    snapshot_diff,
)
from worker.workroot import syncfs
from workloads.drive import PAYLOAD_PYTHON

if TYPE_CHECKING:
    from workloads.registry import Models, Workload

STDERR_TAIL_BYTES = 1500
EXIT_POLL_S = 0.05
DIED_WAIT_S = 1.0  # after the channel closes, how long to wait for the exit status
# Where an environment's wall time goes (the record's ``phases``): preparation (workspace copy,
# cgroup, the mode's container or guest), drive (marker to exit: Ready, rounds, their checks),
# the oracle, cleanup. The campaign's split of its wall time adds these up.
PHASES = ("prepare", "drive", "oracle", "cleanup")
# The steps inside the phases (the record's ``steps``, seconds per ``<phase>.<step>``), so that
# the biggest unmeasured costs can be named: the payload's bytecode (compiled once per process,
# ``worker.bytecode``), the fixture built or found, its copy, the cgroup,
# the mode's own preparation, the staged snapshot, the oracle's model, the sync before the
# marker; the wait for the launcher's shim to have joined the cgroup (before the marker), the
# payload's checks between rounds, the placement checks and the exit; the oracle's
# model (if not kept) and its comparison, the wait for the staged original's check; the mode's
# cleanup, the removal, the wait for the next environment's preparation, the write-back and the
# cgroup's removal.
STEPS = (
    "prepare.bytecode", "prepare.fixture", "prepare.copy", "prepare.cgroup", "prepare.mode",
    "prepare.snapshot", "prepare.model", "prepare.sync", "drive.join", "drive.checks",
    "drive.placement", "drive.exit", "oracle.model", "oracle.compare", "oracle.original",
    "cleanup.mode", "cleanup.remove", "cleanup.wait", "cleanup.sync", "cleanup.cgroup",
)  # fmt: skip


@dataclass(frozen=True)
class Following:
    """An executor's hooks for the environment after this one (``worker.ahead``)."""

    start: Callable[[], None]  # the launcher has exited: its preparation may start
    wait: Callable[[], None]  # until that preparation has ended (before the cgroup's removal)
    # this environment's cleanup has ended: the next one's launcher shim may start, on this
    # thread (its parent), and join its cgroup while this record is stored (``_Run.start_shim``)
    spawn: Callable[[], None] = lambda: None
    # whether that preparation has ended (never blocks): while it has not, the cleanup's wait
    # deletes the trash's large files (``worker.trash.delete_large_while``)
    ready: Callable[[], bool] | None = None


def run_environment(
    spec: EnvironmentSpec,
    *,
    host: HostInfo | None = None,
    stop: threading.Event | None = None,
    preflight: Preflight | None = None,
    models: Models | None = None,
    prepared: Prepared | None = None,
    following: Following | None = None,
) -> EnvironmentRecord | None:
    """Run one environment of ``spec`` and return its unsigned record (None if stopped).

    ``preflight`` is the mode's verdict the caller already has (else it is asked here);
    ``models`` the oracle models the caller keeps across environments (else none is reused);
    ``prepared`` its preparation done ahead (``prepare_environment``), else it is done now;
    ``following`` the hooks for the next one (see ``Prepared.finish``).
    """
    if prepared is None:
        prepared = prepare_environment(
            spec, host=host, stop=stop, preflight=preflight, models=models
        )
    return prepared.finish(following)


def prepare_environment(
    spec: EnvironmentSpec,
    *,
    host: HostInfo | None = None,
    stop: threading.Event | None = None,
    preflight: Preflight | None = None,
    models: Models | None = None,
) -> Prepared:
    """Prepare one environment of ``spec`` up to its marker, but for the final syncfs.

    Raises only for bad input (an unknown mode or workload, more rounds than its fixtures
    prepare), before anything exists; what the preparation itself meets is kept for
    ``Prepared.finish`` (a failure becomes the record, anything else is raised there, after
    cleanup), so it can run on a thread.
    """
    from workloads.registry import Models, get_workload

    mode = get_mode(spec.mode, spec.mode_options)
    workload = get_workload(spec.workload)
    workload.check_rounds(spec.rounds)  # bad input: more rounds than fixtures prepare
    host = host or HostInfo()
    verdict = preflight or preflight_of(mode, host)
    prepared = Prepared(_Run(spec, mode, host, stop, verdict, models or Models(keep=0)), workload)
    prepared.prepare()
    return prepared


class Prepared:
    """One environment prepared up to its marker: ``finish`` runs and records the rest,
    ``discard`` removes it unmeasured (an environment the first-failure rule then skips)."""

    def __init__(self, run: _Run, workload: Workload) -> None:
        self.run, self.workload = run, workload
        self.failure: Failed | None = None  # the preparation's failure: the record's
        self.error: BaseException | None = None  # anything else it raised (Stopped, a bug)
        self.spent_s = 0.0  # the preparation's wall time
        # seconds of it that ran while the environment before it was still being checked and
        # cleaned up (``worker.ahead``): the campaign's wall-time split counts them once
        self.overlapped_s = 0.0

    @property
    def key(self) -> str:
        """The environment's key (``EnvironmentSpec.key``)."""
        return self.run.spec.key()

    def prepare(self) -> None:
        """The preparation; nothing it meets is raised here."""
        started = time.monotonic()
        try:
            self.run.prepare(self.workload)
        except Failed as failure:
            self.failure = failure
        except BaseException as exc:  # noqa: BLE001 -- raised again by finish, after cleanup
            self.error = exc
        finally:
            self.spent_s = time.monotonic() - started

    def prepared_before(self, moment: float) -> float:
        """Seconds of the preparation phase (its spans) that ran before ``moment``."""
        spans = self.run.seen.spans.get("prepare", [])
        return sum(max(0.0, min(end, moment) - start) for start, end in spans)

    def finish(self, following: Following | None = None) -> EnvironmentRecord | None:
        """Syncfs, marker, drive, oracle, cleanup: the unsigned record (None if stopped).

        ``following.start`` is called once, when the launcher has exited and what it left is
        killed (or when the environment failed before that), never when stopped: the next
        environment's preparation may start then; ``following.wait`` before the cleanup's
        syncfs.
        """
        run = self.run
        run.following = following
        started = time.monotonic()
        try:
            if self.error is not None:
                raise self.error
            failure = run.measure(self.workload, self.failure)
        except Stopped:
            return None
        finally:
            run.release_next()
            with run.timed("cleanup"):
                run.cleanup()
            run.seen.overlapped_s = self.overlapped_s
            run.seen.wall_s = self.spent_s + time.monotonic() - started  # its whole cost
        return run.record(failure)

    def start_shim(self) -> None:
        """Start its launcher's shim ahead of the marker (``_Run.start_shim``), if it was
        prepared without a failure."""
        if self.failure is None and self.error is None:
            self.run.start_shim()

    def discard(self) -> None:
        """Clean up without measuring; no record."""
        with self.run.timed("cleanup"):
            self.run.cleanup()


def preflight_of(mode: Mode, host: HostInfo) -> Preflight:
    """The mode's preflight on this host, asked now (a mode whose check raises is not ok).

    Nothing is kept between calls: a caller running many environments asks once and passes the
    verdict in (the gate's ``HostState`` keeps one per campaign and mode).
    """
    try:
        return mode.preflight(host)
    except SandbenchError as exc:
        return Preflight(False, str(exc))


@dataclass
class Observed:
    """What the runner has seen of one environment so far: the record's measured fields, and two
    facts that become its failure rather than fields (``oom``, ``modified``)."""

    started_at: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)  # free-form facts of the record
    ready_ms: float | None = None
    rounds: list[RoundRecord] = field(default_factory=list)
    exit_code: int | None = None
    leftover_processes: int | None = None
    cpu_s: float | None = None
    payload_cpu_s: float | None = None  # what the payload reported at its last done line
    prejoin_cpu_s: float = 0.0  # the launched process's CPU time before it joined the cgroup
    peak_memory_bytes: int | None = None
    oracle: OracleResult | None = None
    original_intact: bool | None = None  # staged modes: the original workspace unchanged
    wall_s: float | None = None
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    steps: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEPS, 0.0))
    # each phase's (start, end) on the monotonic clock, which all processes of a boot share
    spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    overlapped_s: float = 0.0  # preparation that ran beside the previous environment's rest
    oom: bool = False  # the cgroup (or the mode's own) saw an OOM kill
    modified: str | None = None  # how a staged mode's original workspace changed

    def record_fields(self) -> dict[str, Any]:
        """The fields of the record (``phases`` as ``<phase>_s`` seconds)."""
        return {
            "started_at": self.started_at, "provenance": self.provenance,
            "ready_ms": self.ready_ms, "rounds": self.rounds, "exit_code": self.exit_code,
            "leftover_processes": self.leftover_processes, "cpu_s": self.cpu_s,
            "payload_cpu_s": self.payload_cpu_s, "peak_memory_bytes": self.peak_memory_bytes,
            "oracle": self.oracle, "original_intact": self.original_intact, "wall_s": self.wall_s,
            "phases": {f"{name}_s": round(s, 6) for name, s in self.phases.items()},
            "steps": {f"{name}_s": round(s, 6) for name, s in self.steps.items() if s},
            "spans": {name: [[round(a, 6), round(b, 6)] for a, b in pairs]
                      for name, pairs in self.spans.items()},
            "overlapped_s": round(self.overlapped_s, 6),
        }  # fmt: skip


class _Run:
    """The state of one environment while it runs."""

    def __init__(
        self,
        spec: EnvironmentSpec,
        mode: Mode,
        host: HostInfo,
        stop: threading.Event | None,
        preflight: Preflight,
        models: Models,
    ) -> None:
        self.spec, self.mode, self.host, self.stop = spec, mode, host, stop
        self.preflight, self.models = preflight, models
        self.work_root = Path(spec.work_root).resolve()
        self.seen = Observed()
        self.cgroup: cgroups.Cgroup | None = None
        self.env: EnvContext | None = None
        self.base: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.original: dict[str, Any] | None = None
        self.prepared = False
        self.fixture: Path | None = None
        self.problems: list[str] = []  # cleanup trouble, noted in the provenance
        self.following: Following | None = None
        self._started_next = False
        self.shim: Shim | None = None  # the launcher's shim, started ahead of the marker

    # -- the protocol ---------------------------------------------------------------------
    def prepare(self, workload: Workload) -> None:
        """Everything before the final syncfs (raises Failed, Stopped or bad input), and the
        oracle's model computed now if it is not kept yet (so that one prepared ahead has it
        before the oracle that needs it; it depends only on the fixture and the definition)."""
        self.seen.started_at = utc_now()
        self.seen.provenance = self._provenance(self.preflight)
        self._check_stop()
        with self.timed("prepare"):
            self._prepare(workload.ignore)
            assert self.fixture is not None
            if not self.models.keep:  # nothing kept: the oracle would compute it again
                return
            with self.timed("prepare.model"), contextlib.suppress(Exception):
                # a model that cannot be computed: the oracle tries again and says why
                self.models.model(workload, self.spec.seed, self.spec.scale, self.spec.rounds,
                                  self.fixture)  # fmt: skip

    def measure(self, workload: Workload, prepare_failure: Failed | None) -> Failed | None:
        """Syncfs, launch, drive, check: the first failure (classified), or None if passed."""
        try:
            if prepare_failure is not None:
                raise prepare_failure
            self._check_stop()
            with self.timed("prepare"), self.timed("prepare.sync"):
                self._sync()
            with self.timed("drive"):
                self._launch_and_drive()
            self._account()
            self.release_next()
            self._account_mode()
            if self.seen.oom:  # the quota was exceeded, even if the task recovered
                raise Failed("oom", "a process of the environment was OOM-killed")
            self._check_cpu()
            with self.timed("oracle"):
                self._check_result(workload)
        except Failed as failure:
            self._account()
            self.release_next()
            self._account_mode()
            if failure.reason not in ("oracle-mismatch", "workspace-modified"):
                self._check_original()
            return self._classify(failure)
        return None

    def _prepare(self, ignore: tuple[str, ...]) -> None:
        """Fresh workspace from the fixture, the cgroup, the mode's preparation, the snapshot
        (``ignore``: the workload's, under which the oracle's scan of the fixture is cached)."""
        from workloads.fixtures import copy_fixture, ensure_fixture

        spec = self.spec
        name = cgroups.cgroup_name(spec.key())
        self.base = self.work_root / ledger.ENVS_DIR / name
        cgroup = cgroups.new_cgroup(name)
        workspace, env_dir = self.base / "workspace", self.base / "env"
        try:  # the work root owns the environment before anything of it exists (the reaper's)
            ledger.own(self.work_root, name, spec.key(), cgroup.path, cgroup.version)
            env_dir.mkdir(parents=True)
            fixtures = self.work_root / "fixtures"
            with self.timed("prepare.bytecode"):
                bytecode = ensure_bytecode(PAYLOAD_PATH.parent)
            self.seen.provenance["payload_bytecode"] = bytecode
            with self.timed("prepare.fixture"):
                fixture = ensure_fixture(spec.workload, spec.seed, spec.scale, fixtures)
            with self.timed("prepare.copy"):  # the mode's own copies made at the same time
                more = [env_dir / rel for rel in self.mode.fixture_copies]
                self.seen.provenance["workspace_copy"] = copy_fixture(fixture, workspace, *more)
            self.fixture = fixture
        except SandbenchError:  # bad input (a scale the workload refuses): not a result
            raise
        except Exception as exc:  # a full disk, a tool that failed while building the fixture
            raise Failed(os_reason(exc), f"preparing the workspace: {exc}") from exc
        quota = spec.quota
        if overhead := self.mode.cgroup_overhead_bytes:  # room for its client beside the quota
            quota = quota.model_copy(update={"memory_bytes": quota.memory_bytes + overhead})
        self.cgroup = cgroup  # set first: cleanup removes a half-created cgroup
        with self.timed("prepare.cgroup"):
            cgroup.create(quota)
        self.seen.provenance["cgroup"] = self.cgroup.facts()  # the quota as applied
        self.env = EnvContext(spec, workspace, env_dir, self.cgroup.path)
        try:
            self.prepared = True
            with self.timed("prepare.mode"):
                self.mode.prepare(self.env)
        except Exception as exc:  # a mode's preparation failing is a startup failure
            raise Failed(os_reason(exc), f"mode preparation: {exc}") from exc
        if self.mode.staged:
            with self.timed("prepare.snapshot"):
                self.original = self._original_before(fixture, workspace, ignore)
        try:  # a file the harness would otherwise create after the sync
            (env_dir / STDERR_FILE).touch()
        except OSError as exc:
            raise Failed(os_reason(exc), f"preparing the environment: {exc}") from exc

    def _original_before(self, fixture: Path, workspace: Path, ignore: tuple[str, ...]) -> Snapshot:
        """A staged mode's original as it is before the run: the fixture's snapshot (kept per
        fixture; the workspace is its faithful copy), or the workspace's own, its hashes from
        the fixture's cached scan, if the mode's preparation may have changed it."""
        if not self.mode.prepares_workspace:
            return fixture_snapshot(fixture, ignore)
        from workloads.oracle import scan_cached

        known, _ = scan_cached(fixture, ignore)
        return snapshot(workspace, known, holes=True)

    def _sync(self) -> None:
        """Write back everything before the marker: the copies' dirty pages and metadata must
        not be flushed inside round 1's clock, nor what the environments before it left (a
        removal, another environment's preparation)."""
        assert self.base is not None
        try:
            syncfs(self.base)
            if os.stat(self.work_root).st_dev != os.stat(self.base).st_dev:
                syncfs(self.work_root)
        except OSError as exc:
            raise Failed(os_reason(exc), f"syncing the prepared environment: {exc}") from exc

    def _wait_window(self) -> Callable[[], bool] | None:
        """Whether the next environment's preparation is under way, as a poll, if the cleanup
        will wait for it (then the trash's large files are deleted in that wait); else None."""
        following = self.following
        if self._started_next and following is not None and following.ready is not None:
            ready = following.ready
            return lambda: not ready()
        return None

    def _wait_for_next(self, window: Callable[[], bool] | None = None) -> None:
        """Until the next environment's preparation, if started, has ended (module's text);
        while it runs, the large files the trash holds are deleted (``window``)."""
        if self._started_next and self.following is not None:
            with self.timed("cleanup.wait"):
                if window is not None:
                    trash.delete_large_while(self.work_root, window)
                self.following.wait()

    def _spawn_next(self) -> None:
        """Let the next environment's launcher shim start (``start_shim``): after this one's
        cgroup is removed. A join through ``cgroup.procs`` waited for an RCU grace period
        holding the lock the removal needs (4 s more cgroup removal over the smoke campaign
        when the shim started before it); a v1 join through ``tasks`` waits for none, but a v2
        join still does."""
        stopped = self.stop is not None and self.stop.is_set()
        if self._started_next and self.following is not None and not stopped:
            self.following.spawn()

    def release_next(self) -> None:
        """Start the next environment's preparation, once (never after a stop): the launcher
        has exited."""
        if self._started_next or self.following is None:
            return
        if not (self.stop is not None and self.stop.is_set()):
            self._started_next = True
            self.following.start()

    def start_shim(self) -> None:
        """Start the launcher's shim before the marker (``Following.spawn``: on the thread that
        will drive it, at the end of the cleanup of the environment before this one), so its
        start and cgroup join (2 ms here in v1; in v2 an RCU grace period more) overlap the
        signing and storing of that environment's record instead of preceding this one's
        marker (what is left of them is ``drive.join``). The
        marker is still taken when ``_launch_and_drive`` releases it; whatever goes wrong here
        is left to that, which meets it again."""
        if self.shim is not None or self.env is None or self.cgroup is None or not self.prepared:
            return
        try:
            self.shim = self._shim(self.mode.launcher(self.env))
        except Exception:  # noqa: BLE001 -- met again, and classified, when the launcher starts
            self.shim = None

    def _shim(self, argv: list[str]) -> Shim:
        """The launcher's shim, its stdin and stdout the channel, stderr the environment's."""
        assert self.env is not None
        with open(self.env.env_dir / STDERR_FILE, "ab") as stderr:  # made (empty) and synced
            return start_shim(argv, self.cgroup, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=stderr, cwd=self.env.env_dir, bufsize=0)  # fmt: skip

    def _launch_and_drive(self) -> None:
        """Marker, spawn, Ready, rounds, exit, all within the limit from the marker."""
        assert self.env is not None
        assert self.cgroup is not None
        try:
            argv = self.mode.launcher(self.env)
        except Exception as exc:  # a mode that cannot say what to launch cannot start
            raise Failed("launcher-error", f"mode launcher: {exc}") from exc
        self.seen.provenance["shim_started_ahead"] = self.shim is not None
        try:  # the marker t0: just before the launcher's exec, after the cgroup join
            with self.timed("drive.join"):  # its start too, if it was not started ahead
                shim, self.shim = self.shim or self._shim(argv), None
                self.proc = shim.proc  # killed at cleanup even if its release fails
                _, t0, self.seen.prejoin_cpu_s = shim.release()
        except (OSError, subprocess.SubprocessError) as exc:
            raise Failed("launcher-error", f"cannot start {argv[0]}: {exc}") from exc
        self.seen.provenance["prejoin_cpu_s"] = self.seen.prejoin_cpu_s
        deadline = self.env.deadline_ns = t0 + int(self.spec.limit_s * 1e9)
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        channel = Channel(self.proc.stdin, self.proc.stdout, self.stop)
        try:
            ready = self._ready(channel, deadline)
            self.seen.ready_ms = (ready.arrived_ns - t0) / 1e6
            self._check_placement("after Ready")
            self._check(channel, 0, deadline)  # not timed: the payload prepares round 1's inputs
            for k in range(1, self.spec.rounds + 1):
                self._round(channel, k, deadline)
            with self.timed("drive.exit"):
                self._exit(channel, deadline)
        except ChannelStopped as exc:
            raise Stopped from exc
        finally:
            channel.close()

    def _ready(self, channel: Channel, deadline: int) -> Message:
        """The payload's first line must be its ready line."""
        try:
            message = channel.receive(deadline)
        except ChannelStopped:
            raise
        except ChannelTimeout as exc:
            raise Failed("timeout", f"{self._limit()} reached before Ready") from exc
        except ChannelError as exc:
            closed = isinstance(exc, ChannelClosed)
            detail = self._died(f"no ready line: {exc}", before_ready=True, closed=closed)
            raise Failed("no-ready", detail) from exc
        if message.op != "ready":
            raise Failed("no-ready", f"first line is not the ready line: {message.body}")
        return message

    def _round(self, channel: Channel, k: int, deadline: int) -> None:
        """One round: the clock runs from sending ``round k`` to the end of the mode's sync."""
        assert self.env is not None
        start = time.monotonic_ns()
        message = self._ask(channel, {"op": "round", "k": k}, "done", f"round {k}", deadline)
        try:
            self.mode.sync(self.env, k)
        except Exception as exc:  # the mode's synchronization is part of the round
            if time.monotonic_ns() >= deadline:  # it ran out of the environment's time
                raise Failed("timeout", f"{self._limit()} reached in round {k}'s sync") from exc
            raise Failed(os_reason(exc, "round-error"), f"round {k} sync: {exc}") from exc
        task_s = (time.monotonic_ns() - start) / 1e9
        self._note_payload_cpu(message)  # the clock has stopped: containment and validation
        self._check_placement(f"after round {k}")
        checked = self._check(channel, k, deadline)
        validated = checked.body.get("validated") is True
        digest = checked.body.get("digest") or message.body.get("digest")
        self.seen.rounds.append(
            RoundRecord(k=k, task_s=task_s, validated=validated, digest=_text(digest))
        )
        if not validated:
            raise Failed("validation-failed", f"round {k}: the payload's check failed")
        if time.monotonic_ns() > deadline:
            raise Failed("timeout", f"{self._limit()} reached in round {k}")

    def _check(self, channel: Channel, k: int, deadline: int) -> Message:
        """Ask the payload to check round ``k`` (and prepare k+1's inputs), outside the clock."""
        request = {"op": "check", "k": k, "next": k < self.spec.rounds}
        with self.timed("drive.checks"):
            return self._ask(channel, request, "checked", f"check of round {k}", deadline)

    def _ask(
        self, channel: Channel, request: dict[str, Any], answer: str, what: str, deadline: int
    ) -> Message:
        """Send ``request`` and receive its ``answer`` line for the same k; else classify."""
        try:
            channel.send(request)
            message = channel.receive(deadline)
        except ChannelStopped:
            raise
        except ChannelTimeout as exc:
            raise Failed("timeout", f"{self._limit()} reached in {what}") from exc
        except ChannelError as exc:
            closed = isinstance(exc, ChannelClosed)
            raise Failed("round-error", self._died(f"{what}: {exc}", closed=closed)) from exc
        if message.op == "error":
            raise Failed("round-error", f"{what}: {message.body.get('message', message.body)}")
        if message.op != answer or message.body.get("k") != request["k"]:
            raise Failed("round-error", f"{what}: unexpected answer {message.body}")
        return message

    def _exit(self, channel: Channel, deadline: int) -> None:
        """Send exit; the launcher must exit before the deadline; what it left is killed."""
        assert self.proc is not None
        with contextlib.suppress(ChannelClosed):
            channel.send({"op": "exit"})
        code = self._wait_exit(deadline)
        if code is None:
            raise Failed("timeout", f"{self._limit()} reached with the launcher still running")
        self.seen.exit_code = code
        self._kill_leftovers()
        if code != 0:
            raise Failed("nonzero-exit", f"launcher exited with status {code}{self._stderr()}")

    def _kill_leftovers(self) -> None:
        """Count the processes left in the cgroup after the launcher exited; kill them at once.

        As BenchExec does when the tool exits: the launcher's exit ends the environment's
        tree, so a detached child cannot hold the environment until its limit.
        """
        assert self.cgroup is not None
        left = self.cgroup.pids()
        self.seen.leftover_processes = len(left)
        if left:
            self._kill()

    def _wait_exit(self, deadline: int) -> int | None:
        """The launcher's exit status, or None at the deadline (watching the stop event).

        The exit is seen the moment it happens (a pidfd becomes readable), not at the next
        step of ``Popen.wait``'s backoff, which would add up to half the time waited.
        """
        assert self.proc is not None
        with _exit_watch(self.proc.pid) as exited:
            while self.proc.poll() is None:
                remaining = (deadline - time.monotonic_ns()) / 1e9
                if remaining <= 0:
                    return None
                if not exited(min(remaining, EXIT_POLL_S)):
                    self._check_stop()
        return self.proc.returncode

    # -- after the launcher --------------------------------------------------------------
    def _account(self) -> None:
        """Kill what is left, then read CPU time, peak memory and OOM kills from the cgroup."""
        if self.proc is not None:
            self._kill()
            if self.seen.exit_code is None:
                self.seen.exit_code = self.proc.returncode
        if self.cgroup is not None:
            self.seen.cpu_s = self.cgroup.cpu_seconds()
            self.seen.peak_memory_bytes = self.cgroup.peak_memory()
            self.seen.oom = self.cgroup.oom_killed()

    def _account_mode(self) -> None:
        """Add the mode's own OOM verdict (a sandbox or container with its own memory cgroup),
        before cleanup removes it; asked after ``release_next``, so a container engine's answer
        (a ``podman inspect``: tens of ms) overlaps the next environment's preparation."""
        if self.env is None or not self.prepared or self.seen.oom:
            return
        try:
            self.seen.oom = self.mode.oom_killed(self.env)
        except Exception as exc:  # noqa: BLE001 -- a verdict we cannot get is noted, never a crash
            self.problems.append(f"mode OOM check: {exc}")

    def _note_payload_cpu(self, done: Message) -> None:
        """Keep the CPU time the payload reported for itself at its done line."""
        cpu_s = done.body.get("cpu_s")
        if isinstance(cpu_s, int | float) and not isinstance(cpu_s, bool):
            self.seen.payload_cpu_s = float(cpu_s)

    def _check_placement(self, when: str) -> None:
        """Every process of the launcher's tree is inside the environment's cgroup."""
        assert self.proc is not None
        assert self.cgroup is not None
        with self.timed("drive.placement"):
            problem = containment.placement_problem(self.cgroup, self.proc.pid, when)
        if problem:
            raise Failed("quota-escaped", problem)

    def _check_cpu(self) -> None:
        """The cgroup saw (nearly) all the CPU time the payload reports for itself."""
        cpu_s, payload = self.seen.cpu_s, self.seen.payload_cpu_s
        floor, prejoin = self.mode.reported_cpu_floor, self.seen.prejoin_cpu_s
        if cpu_s is not None and (
            problem := containment.cpu_problem(cpu_s, payload, floor, prejoin)
        ):
            raise Failed("quota-escaped", problem)

    def _check_result(self, workload: Workload) -> None:
        """The oracle on the result root, then (staged) the original workspace's integrity."""
        assert self.env is not None
        assert self.fixture is not None  # prepared: the workspace was copied from it
        spec = self.spec
        # staged: the original's check on a thread beside the comparison (both mostly read and
        # hash; a large tree walked by a process of its own, ``snapshot_after``);
        # ``oracle.original`` is then only the time waited for it after the comparison
        pool = ThreadPoolExecutor(1, thread_name_prefix="original")
        original = pool.submit(self._check_original)
        try:
            from workloads.oracle import compare

            # the model starts from the very fixture this workspace was copied from
            with self.timed("oracle.model"):
                model = self.models.model(workload, spec.seed, spec.scale, spec.rounds,
                                          self.fixture)  # fmt: skip
            # a staged original of a large tree is checked by a process of its own meanwhile
            # (``snapshot_after``): then no second one for the comparison, on two CPUs
            alone = self.original is None or len(self.original) < APART_ENTRIES
            with self.timed("oracle.compare"):
                mismatches = list(compare(self.mode.result_root(self.env), model, apart=alone))
        except Exception as exc:  # noqa: BLE001 -- an oracle that cannot even look is a mismatch, with why
            mismatches = [f"oracle could not compare: {exc}"]
        finally:
            with self.timed("oracle.original"):
                pool.shutdown()
        original.result()  # what the check raised, as before
        self.seen.oracle = OracleResult(ok=not mismatches, mismatches=mismatches[:100])
        if mismatches:
            raise Failed("oracle-mismatch", "; ".join(mismatches[:5]))
        if self.seen.original_intact is False:
            raise Failed("workspace-modified", self.seen.modified or "original workspace changed")

    def _check_original(self) -> None:
        """For staged modes: is the original workspace byte-identical to its snapshot?"""
        if self.original is None or self.env is None:
            return
        try:
            after = snapshot_after(self.env.workspace, self.original)
        except OSError as exc:  # a check that cannot even look is a change, with why (the oracle's)
            changes = [f"the check could not look: {exc}"]
        else:
            changes = snapshot_diff(self.original, after)
        self.seen.original_intact = not changes
        if changes:
            self.seen.modified = "original workspace changed: " + "; ".join(changes[:5])

    def _classify(self, failure: Failed) -> Failed:
        """The real cause (OOM kill or full disk outrank their symptom), with the mode's context."""
        failure = real_cause(failure, self.seen.oom, self._stderr())
        if self.env is not None and (context := self._failure_context()):
            failure.detail = f"{failure.detail}; {context}"
        return failure

    def _failure_context(self) -> str:
        """What the mode adds to a failure's detail; a diagnostic never replaces the failure."""
        assert self.env is not None
        try:
            return self.mode.failure_context(self.env)
        except Exception as exc:  # noqa: BLE001 -- the failure must stay what it was
            return f"(no {self.mode.name} context: {exc})"

    def record(self, failure: Failed | None) -> EnvironmentRecord:
        """The record of this environment."""
        fields = self.seen.record_fields()
        if failure is None:
            fields.update(outcome="passed")
        else:
            assert failure.reason in REASONS
            fields.update(outcome="failed", failure_class=REASONS[failure.reason])
            fields.update(reason=failure.reason, detail=failure.detail[:2000])
        return EnvironmentRecord.from_spec(self.spec, **fields)

    # -- helpers ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def timed(self, part: str) -> Iterator[None]:
        """Add the wall time of the block to ``part``: a phase (``PHASES``) or a step inside one
        (``STEPS``)."""
        times = self.seen.steps if "." in part else self.seen.phases
        start = time.monotonic()
        try:
            yield
        finally:
            end = time.monotonic()
            times[part] += end - start
            if times is self.seen.phases:
                self.seen.spans.setdefault(part, []).append((start, end))

    def _provenance(self, preflight: Preflight) -> dict[str, Any]:
        """Per-environment facts: the mode's preflight, the cgroup version, the payload."""
        return {
            "preflight": {"ok": preflight.ok, "reason": preflight.reason, **preflight.facts},
            "cgroup_version": cgroups.detect(),
            "payload_python": PAYLOAD_PYTHON,
            "quota": self.spec.quota.model_dump(),
            "limit_s": self.spec.limit_s,
        }

    def _limit(self) -> str:
        """The limit as a timeout's detail names it: "limit of N s"."""
        return f"limit of {self.spec.limit_s:g} s"

    def _died(self, what: str, before_ready: bool = False, closed: bool = True) -> str:
        """Describe a payload that stopped talking: exit status and its stderr's tail."""
        assert self.proc is not None
        if closed:  # the output ended: the exit status follows at once
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=DIED_WAIT_S)
        code = self.proc.poll()
        if code is not None:
            self.seen.exit_code = code
            what += f" (launcher exit status {code})"
            if before_ready and code in LAUNCH_FAILURE_CODES:
                raise Failed("launcher-error", what + self._stderr())
        return what + self._stderr()

    def _stderr(self) -> str:
        """The tail of the launcher's stderr, for a failure's detail."""
        if self.env is None:
            return ""
        path = self.env.env_dir / STDERR_FILE
        with contextlib.suppress(OSError), open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - STDERR_TAIL_BYTES))
            tail = handle.read().decode(errors="replace").strip()
            return f"; stderr: {tail}" if tail else ""
        return ""

    def _kill(self) -> None:
        """Kill the launcher's tree and reap it; a tree that will not die is noted, not raised."""
        assert self.proc is not None
        try:
            kill_process(self.proc, self.cgroup)
        except (SandbenchError, subprocess.TimeoutExpired) as exc:
            self.problems.append(f"kill: {exc}")

    def _end_processes(self) -> None:
        """Kill the launcher's tree, or a shim started ahead that never ran it."""
        if self.shim is not None:  # started ahead, never released: the environment did not run
            self.shim.abandon()
            close_pipes(self.shim.proc)
            self.shim = None
        if self.proc is not None:
            self._kill()
            close_pipes(self.proc)

    def _check_stop(self) -> None:
        """Raise Stopped when the caller asked to stop."""
        if self.stop is not None and self.stop.is_set():
            raise Stopped

    def cleanup(self) -> None:
        """Kill leftovers, let the mode clean up, remove the environment's files and then its
        cgroup (which reclaims what is still charged to it, so no dying cgroup piles up).

        Problems are noted in the record's provenance (``cleanup``); a path outside the work
        root is never deleted (that raises: it is a bug, not a benchmark result).
        """
        problems = self.problems
        self._end_processes()
        if self.prepared and self.env is not None:
            try:
                with self.timed("cleanup.mode"):
                    self.mode.cleanup(self.env)
            except Exception as exc:  # noqa: BLE001 -- go on: the cgroup and files must still be removed
                problems.append(f"mode cleanup: {exc}")
        if self.cgroup is not None:  # nothing may still write into the tree removed next
            try:
                self.cgroup.kill()
            except SandbenchError as exc:
                problems.append(str(exc))
        if self.base is not None:  # first: deleted (or trashed) files' pages can then go
            window = self._wait_window()
            with self.timed("cleanup.remove"):
                problems.extend(trash.discard(self.base, self.work_root,
                                              defer_large=window is not None))  # fmt: skip
            self._wait_for_next(window)
            try:  # the removal written back, so the metadata pages it dirtied can go too
                with self.timed("cleanup.sync"):
                    syncfs(self.work_root)
            except OSError as exc:
                problems.append(f"syncfs after removal: {exc}")
        if self.cgroup is not None:  # then what is still charged is reclaimed and it goes
            try:
                with self.timed("cleanup.cgroup"):
                    self.cgroup.remove()
            except SandbenchError as exc:
                problems.append(str(exc))
        if self.base is not None and not problems:  # else the entry stays: the reaper finishes
            ledger.release(self.work_root, self.base.name)
        if problems:
            self.seen.provenance["cleanup"] = problems
        self._spawn_next()


@contextlib.contextmanager
def _exit_watch(pid: int) -> Iterator[Callable[[float], bool]]:
    """A wait for ``pid``'s exit with a timeout: whether it exited (a pidfd, polled once)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # reaped already: poll() has its status
        yield lambda _timeout: True
        return
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            yield lambda timeout: bool(selector.select(timeout))
    finally:
        os.close(fd)


def _text(value: Any) -> str | None:
    """A digest as text (None stays None)."""
    return None if value is None else str(value)
