"""The embedded executor: one campaign on this machine, in-process, no broker.

Same expansion, gate (``worker.gate.run_planned``), records, finalization, analysis and report
as the fleet; only the transport differs, and the first-failure rule's evidence is the records
this host already stored. Environments run one at a time in the host's seeded order. A stop request
(Ctrl-C) lets the runner kill and clean up the running environment, which gets no record; a
resumed campaign runs it again fresh and skips every environment already recorded.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from contract.errors import SandbenchError, StoreError
from contract.names import check_name
from contract.paths import DEFAULT_WORK_ROOT
from contract.records import EnvironmentRecord, EnvironmentSpec
from contract.signing import CoordinatorKey, HostKey
from contract.spec_signing import sign_spec
from coordinator.plan.campaign import expand, new_campaign_id
from coordinator.plan.file import Plan
from coordinator.results.walltime import WallSplit
from coordinator.store.store import Store
from coordinator.store.trust import HostRegistry
from worker.ahead import Ahead
from worker.gate import HostState, RecordedFailures, run_planned, verdict_facts
from worker.modes import HostInfo, Preflight
from worker.runner import Following


@dataclass
class RunResult:
    """What happened to a campaign in this process."""

    campaign_id: str
    planned: int
    recorded_before: int
    recorded_now: int = 0
    stopped: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    wall: WallSplit = field(default_factory=WallSplit)  # where this run's wall time went

    @property
    def complete(self) -> bool:
        """Every planned environment of this host has a record."""
        return self.recorded_before + self.recorded_now == self.planned


def trust_own_keys(key: HostKey, signer: CoordinatorKey, registry: HostRegistry) -> None:
    """Register this host's and this coordinator's own keys (a local campaign verifies by them)."""
    registry.add(key.name, key.public_b64())
    registry.add_coordinator(signer.public_b64())


@dataclass
class OwnKeys:
    """This machine's host and coordinator keys for a local run, checked before any is made or
    trusted: a refused run leaves the keys and the registry as they were."""

    host_path: Path | None  # None: the default, $SANDBENCH_HOME/host.key
    coordinator_path: Path
    host_name: str
    host: HostKey | None  # None: not made yet
    coordinator: CoordinatorKey | None

    @classmethod
    def check(
        cls, host_path: Path | None, host_name: str | None, coordinator_path: Path,
        registry: HostRegistry,
    ) -> OwnKeys:  # fmt: skip
        """The keys as they are, read and checked (a key of another host, a name registered
        with another key, an unreadable key or registry is refused); writes nothing."""
        host = HostKey.load_if_present(host_path, host_name)
        coordinator = CoordinatorKey.load_if_present(coordinator_path)
        name = host.name if host else check_name(host_name or socket.gethostname(), "host name")
        registry.check(name, host.public_b64() if host else None)
        return cls(host_path, coordinator_path, name, host, coordinator)

    def make(self, registry: HostRegistry) -> tuple[HostKey, CoordinatorKey]:
        """The keys, each made if absent, trusted by ``registry``."""
        host = self.host or HostKey.load_or_create(self.host_path, self.host_name)
        coordinator = self.coordinator or CoordinatorKey.load_or_create(self.coordinator_path)
        trust_own_keys(host, coordinator, registry)
        return host, coordinator


def check_planned_here(campaign_id: str, hosts: list[str], host: str) -> None:
    """StoreError unless campaign ``campaign_id``, planned for ``hosts``, plans ``host``."""
    if host not in hosts:
        raise StoreError(
            f"campaign {campaign_id} planned hosts {', '.join(hosts)}, not this host '{host}'; "
            "run it on that host or pass --host-name"
        )


def start_campaign(store: Store, plan_text: str, plan: Plan, host: str, work_root: Path) -> str:
    """Expand ``plan`` for this host, store it and return the new campaign id."""
    campaign_id = new_campaign_id()
    specs = expand(plan, [host], campaign_id, str(work_root))
    return store.create_campaign(plan_text, plan, specs)


def host_provenance(store: Store, campaign_id: str, host: HostInfo) -> dict[str, Any]:
    """This host's provenance for a campaign (mode verdicts are added as they are known)."""
    from worker.provenance import collect

    plan = store.load_campaign(campaign_id).plan
    return collect(
        host.name, host.work_root, campaign=campaign_id, seed=plan.get("seed", 0),
        cohort=plan.get("cohort", "default"), quota=plan.get("quota", {}),
    )  # fmt: skip


class LocalExecutor:
    """Runs one host's planned environments of a stored campaign in order, through the gate."""

    def __init__(
        self,
        store: Store,
        campaign_id: str,
        key: HostKey,
        work_root: Path,
        stop: threading.Event | None = None,
    ) -> None:
        self.store, self.campaign_id = store, campaign_id
        self.stop = stop or threading.Event()
        self.host = HostState(key, Path(work_root), on_verdict=self._keep_verdict,
                              coordinator=store.signer.public_b64())  # fmt: skip
        self.provenance: dict[str, Any] = {"modes": {}}
        campaign = store.load_campaign(campaign_id)
        check_planned_here(campaign_id, campaign.hosts, key.name)
        self.specs = campaign.host_specs(key.name)
        self.records = store.records(campaign_id, key.name)
        self.failures = RecordedFailures(self.records)
        self.ahead = Ahead(self.host, self.failures, self.stop)  # the next one, prepared early

    def _keep_verdict(self, spec: EnvironmentSpec, verdict: Preflight) -> None:
        """Add a mode's new preflight verdict to this host's provenance."""
        self.provenance["modes"][spec.mode] = verdict_facts(verdict)
        self.store.write_provenance(self.campaign_id, self.host.name, self.provenance)

    def execute(
        self, spec: EnvironmentSpec, following: EnvironmentSpec | None = None
    ) -> EnvironmentRecord | None:
        """The signed record of one environment, from the gate (None if stopped mid-way).

        The spec goes to the gate signed by this machine's coordinator key, as the fleet's do;
        the embedded run trusts its own plan, so command modes need no allowlist here. Its
        preparation may have been done ahead; ``following``, the environment after it, is
        prepared once its launcher has exited (``worker.ahead``).
        """
        signed = sign_spec(spec, self.store.signer)
        hooks = None
        if following is not None:
            start = partial(self._start_ahead, following)
            hooks = Following(start=start, wait=self.ahead.wait, spawn=self.ahead.spawn,
                              ready=self.ahead.ready)  # fmt: skip
        return run_planned(
            signed, self.host, self.failures, stop=self.stop,
            prepared=self.ahead.take(signed), following=hooks,
        )  # fmt: skip

    def _start_ahead(self, spec: EnvironmentSpec) -> None:
        """Start preparing ``spec`` (the runner's hook once the current launcher has exited)."""
        self.ahead.start(sign_spec(spec, self.store.signer))

    def keep(self, record: EnvironmentRecord) -> None:
        """Store a signed record."""
        self.store.append_record(record)
        self.records.append(record)

    def _start_provenance(self) -> None:
        """This host's provenance, keeping what a stopped run of this campaign already knew."""
        earlier = self.store.provenance(self.campaign_id, self.host.name)
        self.provenance = host_provenance(self.store, self.campaign_id, self.host.info())
        self.provenance["modes"] = dict(earlier.get("modes", {}))
        if earlier:
            self.provenance["first_started"] = earlier.get("first_started", earlier.get("date"))
        self.store.write_provenance(self.campaign_id, self.host.name, self.provenance)

    def run(self, console: Console | None = None, show_progress: bool = True) -> RunResult:
        """Run every environment without a record, in order, until done or asked to stop."""
        done = {r.key() for r in self.records}
        todo = [s for s in self.specs if s.key() not in done]
        result = RunResult(self.campaign_id, len(self.specs), len(self.specs) - len(todo))
        if todo:  # a resume with nothing left to run rewrites nothing (the head covers it)
            self._start_provenance()
        progress = _progress(console or Console(stderr=True), show_progress)
        with progress:
            task = progress.add_task(
                "starting", total=len(self.specs), completed=result.recorded_before
            )
            followers: list[EnvironmentSpec | None] = [*todo[1:], None] if todo else []
            try:
                for spec, following in zip(todo, followers, strict=True):  # each with the next
                    if self.stop.is_set():
                        break
                    progress.update(
                        task, description=f"{spec.mode} / {spec.workload} #{spec.env_index}"
                    )
                    record = self.execute(spec, following)
                    if record is None:
                        break  # stopped mid-environment: no record, a resume runs it again
                    self.keep(record)
                    result.wall.add(record)
                    result.recorded_now += 1
                    result.counts[record.outcome] = result.counts.get(record.outcome, 0) + 1
                    progress.advance(task)
            finally:  # one prepared ahead and not run (a stop): removed, unmeasured
                self.ahead.close()
            progress.update(task, description="stopped" if self.stop.is_set() else "done")
        result.stopped = not result.complete
        return result


def _progress(console: Console, enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("environments"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
        transient=False,
    )


def run_campaign(
    store: Store,
    key: HostKey,
    *,
    plan: tuple[str, Plan] | None = None,
    resume: str | None = None,
    work_root: Path = DEFAULT_WORK_ROOT,
    registry: HostRegistry | None = None,
    stop: threading.Event | None = None,
    console: Console | None = None,
    show_progress: bool = True,
) -> RunResult:
    """Start (``plan``) or resume (``resume``) a campaign on this machine and run it."""
    if (plan is None) == (resume is None):
        raise SandbenchError("give either a plan or a campaign id to resume, not both")
    trust_own_keys(key, store.signer, registry or HostRegistry())
    if resume is not None:
        campaign_id = resume
    else:
        assert plan is not None
        campaign_id = start_campaign(store, plan[0], plan[1], key.name, work_root)
    executor = LocalExecutor(store, campaign_id, key, work_root, stop)
    started = time.monotonic()
    result = executor.run(console, show_progress)
    result.wall.wall_s = time.monotonic() - started
    result.counts["elapsed_s"] = int(result.wall.wall_s)
    return result


def summary_line(result: RunResult) -> str:
    """One line: how many environments were recorded and whether the campaign is complete."""
    total = result.recorded_before + result.recorded_now
    state = "complete" if result.complete else "stopped; resume with --resume " + result.campaign_id
    parts = ", ".join(f"{v} {k}" for k, v in sorted(result.counts.items()) if k != "elapsed_s")
    return f"{total} of {result.planned} environments recorded ({parts or 'none new'}); {state}"
