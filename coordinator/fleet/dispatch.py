"""Fleet dispatch: store the expanded campaign, then queue each host's environments in order.

Every spec is sent signed by the coordinator key (the store's signer): a worker runs nothing
else. Also the repairs: ``rerun`` of a cell by one of its task ids, and of every failed cell.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from celery import Celery

from contract.broker import check_broker, redis_client
from contract.errors import FleetError, StoreError
from contract.outbox import by_host as by_host  # the send path lives beside the outbox
from contract.outbox import send_specs as send_specs
from contract.paths import DEFAULT_WORK_ROOT
from contract.records import EnvironmentSpec
from coordinator.fleet.coordinator import ACTIVE_CAMPAIGNS_KEY, FINALIZED_KEY
from coordinator.store.progress import host_progress
from coordinator.store.store import Store


def with_task_ids(specs: list[EnvironmentSpec]) -> list[EnvironmentSpec]:
    """``specs`` each with a fresh task id (the key to find and rerun it later)."""
    return [s.model_copy(update={"task_id": uuid.uuid4().hex}) for s in specs]


def watch_campaign(app: Celery, campaign: str) -> None:
    """Tell the coordinator to watch ``campaign`` until every host is finalized."""
    redis_client(app.conf.broker_url).sadd(ACTIVE_CAMPAIGNS_KEY, campaign)


def unregistered_hosts(hosts: list[str]) -> tuple[list[str], Path]:
    """Those of ``hosts`` not in the trusted registry (their records would be rejected), and
    the registry's path."""
    from coordinator.store.trust import HostRegistry

    registry = HostRegistry()
    return [h for h in hosts if h not in registry], registry.path


def check_registered(hosts: list[str]) -> None:
    """FleetError naming the first of ``hosts`` not in the trusted registry, and the fix."""
    unknown, registry = unregistered_hosts(hosts)
    if unknown:
        raise FleetError(
            f"host {', '.join(unknown)} is not registered in {registry}: its records would be "
            f"rejected; register it with 'sandbench hosts add {unknown[0]} PUBKEY' (its worker "
            "prints the line), or dispatch anyway with --allow-unregistered"
        )


def dispatch_specs(
    app: Celery, store: Store, plan_text: str, plan: Any, specs: list[EnvironmentSpec]
) -> str:
    """Store a campaign of ``specs`` (task ids assigned here) and queue it; the campaign id."""
    if not specs:
        raise FleetError("the plan expands to no environments; nothing to dispatch")
    if any(s.task_id is None for s in specs):
        specs = with_task_ids(specs)
    check_broker(app.conf.broker_url)  # nothing is stored for a campaign that cannot be queued
    campaign = store.create_campaign(plan_text, plan, specs)
    watch_campaign(app, campaign)
    send_specs(app, specs, store.signer)
    return campaign


def dispatch_plan(
    app: Celery,
    store: Store,
    plan_path: Path,
    hosts: list[str],
    work_root: str | None = None,
    allow_unregistered: bool = False,
) -> str:
    """Expand the plan at ``plan_path`` for ``hosts`` (seeded order per host) and queue it;
    a host not in the trusted registry is refused unless ``allow_unregistered``."""
    from coordinator.plan.campaign import expand, new_campaign_id
    from coordinator.plan.file import load_plan

    plan_text, plan = load_plan(plan_path)  # a bad plan is named first
    if not allow_unregistered:
        check_registered(hosts)
    specs = expand(plan, hosts, new_campaign_id(), work_root or str(DEFAULT_WORK_ROOT))
    return dispatch_specs(app, store, plan_text, plan, specs)


def latest_cell_specs(
    planned: list[EnvironmentSpec], cell: tuple[str, str, str]
) -> list[EnvironmentSpec]:
    """The environments of ``cell``'s latest attempt, in run order."""
    mine = [s for s in planned if s.cell() == cell]
    latest = max(s.attempt for s in mine)
    return sorted((s for s in mine if s.attempt == latest), key=lambda s: s.order_index)


def rerun_cell(app: Celery, store: Store, campaign: str, cell: tuple[str, str, str]) -> list[str]:
    """Queue ``cell``'s environments again as a new attempt; the new task ids."""
    current = latest_cell_specs(store.load_campaign(campaign).specs, cell)
    attempt = current[0].attempt + 1
    fresh = with_task_ids([s.model_copy(update={"attempt": attempt}) for s in current])
    check_broker(app.conf.broker_url)  # nothing is planned that cannot be queued
    store.add_environments(campaign, fresh)
    client = redis_client(app.conf.broker_url)
    client.hdel(FINALIZED_KEY.format(campaign=campaign), cell[0])
    watch_campaign(app, campaign)
    send_specs(app, fresh, store.signer)
    return [s.task_id for s in fresh if s.task_id]


def rerun_task(app: Celery, store: Store, task_id: str) -> tuple[str, list[str]]:
    """Rerun the whole cell of the environment queued as ``task_id``; campaign and task ids."""
    try:
        campaign, spec = store.find_task(task_id)
    except StoreError as exc:
        raise FleetError(f"{exc}; 'sandbench status ID' lists the task ids of failures") from exc
    if spec.kind != "environment":  # a sentinel environment belongs to no cell
        raise FleetError(f"task {task_id} is a sentinel environment, in no cell: nothing to rerun")
    return campaign, rerun_cell(app, store, campaign, spec.cell())


def failed_cells(store: Store, campaign: str) -> list[tuple[str, str, str]]:
    """Cells whose latest attempt has a failed environment."""
    planned = [s for s in store.load_campaign(campaign).specs if s.kind == "environment"]
    cells = []
    for host in sorted({s.host for s in planned}):
        records = host_progress(store, campaign, host, parse=True).records
        for cell in sorted({s.cell() for s in planned if s.host == host}):
            latest = latest_cell_specs(planned, cell)
            if any(records.get(s.key()) and records[s.key()].outcome == "failed" for s in latest):
                cells.append(cell)
    return cells


def rerun_failed(app: Celery, store: Store, campaign: str) -> list[str]:
    """Rerun every failed cell of ``campaign``; the new task ids."""
    new_ids: list[str] = []
    for cell in failed_cells(store, campaign):
        new_ids += rerun_cell(app, store, campaign, cell)
    return new_ids
