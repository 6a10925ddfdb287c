"""Benchmark: messages dispatched per second for a campaign of 10,000 environments.

Starts a private redis-server (append-only, fsync as in ops/redis.conf), then times
``dispatch_specs`` (store the campaign, queue every environment on its host's queue) and the
queueing alone. Run: .venv/bin/python benchmarks/fleet_dispatch.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from coordinator.dispatch import dispatch_specs, send_specs, with_task_ids  # noqa: E402
from coordinator.store import Store  # noqa: E402
from tasks.app import create_app, host_queue  # noqa: E402
from tasks.records import EnvironmentSpec  # noqa: E402
from tasks.signing import CoordinatorKey  # noqa: E402
from tests.fleet_helpers import OPS_APPENDFSYNC, RedisServer  # noqa: E402

ENVIRONMENTS = 10_000
HOSTS = ("lab-a", "lab-b")


def specs(campaign: str) -> list[EnvironmentSpec]:
    """10,000 environments over two hosts, in run order."""
    per_host = ENVIRONMENTS // len(HOSTS)
    return [
        EnvironmentSpec(campaign=campaign, host=h, mode="native", workload="publish",
                        env_index=i, order_index=i, scale=0.02, work_root="/var/tmp/sandbench")
        for h in HOSTS for i in range(per_host)
    ]  # fmt: skip


def main() -> None:
    """Print dispatch throughput (whole dispatch, and queueing alone)."""
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        server = RedisServer(Path(tmp) / "redis", appendfsync=OPS_APPENDFSYNC)
        server.start()
        app = create_app(server.url())
        try:
            t0 = time.perf_counter()
            store = Store(Path(tmp) / "data", signer=CoordinatorKey.generate())
            campaign = dispatch_specs(app, store, "", {}, specs("c-bench-1"))
            whole = time.perf_counter() - t0
            client = server.client()
            queued = sum(client.llen(host_queue(h)) for h in HOSTS)
            client.flushall()
            client.close()
            again = with_task_ids(specs("c-bench-2"))
            t0 = time.perf_counter()
            send_specs(app, again, store.signer)
            send_only = time.perf_counter() - t0
            app.conf.task_send_sent_event = False  # for comparison only: Flower needs the events
            third = with_task_ids(specs("c-bench-3"))
            t0 = time.perf_counter()
            send_specs(app, third, store.signer)
            no_events = time.perf_counter() - t0
        finally:
            app.close()
            server.stop()
    print(f"campaign {campaign}: {ENVIRONMENTS} environments, {queued} messages queued "
          f"(redis appendfsync {OPS_APPENDFSYNC}, as in ops/redis.conf)")  # fmt: skip
    print(
        f"dispatch (store campaign + queue): {whole:.2f} s, {ENVIRONMENTS / whole:.0f} messages/s"
    )
    print(f"queueing alone: {send_only:.2f} s, {ENVIRONMENTS / send_only:.0f} messages/s")
    print(f"queueing without task-sent events (not the fleet's setting): {no_events:.2f} s, "
          f"{ENVIRONMENTS / no_events:.0f} messages/s")  # fmt: skip


if __name__ == "__main__":
    main()
