"""Flower as the fleet runs it: a read-only live view behind basic auth, never the record.

Read-only is Flower's own ``--read_only`` (Flower 2.2): every endpoint that would act on the
fleet (``/api/task/apply``, ``async-apply``, ``send-task``, ``abort``, ``revoke``, ``timeout``,
``rate-limit`` and the worker controls: shutdown, pool restart/grow/shrink/autoscale, queue
consumers) answers 403 and the pages hide their buttons. Whoever holds Flower's password can
watch the fleet, never run or stop anything on it.

Outcomes: every ``run_environment`` task ends SUCCESS, also for an environment that failed its
measurement; its result text says what happened (``worker.fleet.outcome_text``), so the task
list shows each environment's outcome and reason, and ``FAILED_FILTER`` finds the failed ones.
Flower is a view: the signed records in the store are the results.
"""

from __future__ import annotations

from contract.environ import setting
from contract.errors import FleetError
from worker.fleet import OUTCOME_TAG

AUTH_ENVS = ("SANDBENCH_FLOWER_AUTH", "FLOWER_BASIC_AUTH")
# The task list shows what a user watches for: the environment (host mode/workload #i, in
# args), its outcome and reason (the result text starts with the outcome, e.g.
# ``outcome:failed task/nonzero-exit: ...``), and, last, the task id ``sandbench rerun`` takes.
TASK_COLUMNS = ("name", "args", "result", "state", "received", "runtime", "worker", "uuid")
# Typed into the task page's search box, this leaves every failed measurement (and nothing else):
# the task's state is SUCCESS whatever the outcome (a failed measurement is a record, not an
# exception), so Flower's own "Failed" filter shows only tasks that raised (a refused spec).
FAILED_FILTER = f"{OUTCOME_TAG}failed"
READ_ONLY_OPTION = "read_only"


def basic_auth() -> str:
    """``user:password`` from the environment; ``FleetError`` saying how to set it otherwise."""
    auth = next((v for e in AUTH_ENVS if (v := setting(e))), None)
    if not auth or ":" not in auth:
        raise FleetError("Flower needs basic auth: set SANDBENCH_FLOWER_AUTH=user:password")
    return auth


def require_read_only() -> None:
    """Refuse a Flower without ``--read_only``: it would let its users apply tasks."""
    from flower.options import default_options

    if READ_ONLY_OPTION not in default_options:
        raise FleetError(
            "this Flower has no --read_only option, so its API could apply and revoke tasks; "
            "install flower>=2.2 (pip install 'flower>=2.2')"
        )


def flower_argv(port: int, address: str) -> list[str]:
    """The ``celery flower`` arguments of the fleet's view (credentials stay in the env)."""
    return [
        "flower",
        f"--port={port}",
        f"--address={address}",
        f"--{READ_ONLY_OPTION}=true",
        f"--tasks_columns={','.join(TASK_COLUMNS)}",
    ]
