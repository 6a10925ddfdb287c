"""Benchmark: per-environment orchestration overhead of the fleet for a trivial workload.

Real redis-server, one real worker process and the coordinator; environments (native
``publish`` at scale 0.02, one round) are sent one at a time, each after the previous record
was stored, so no queueing is counted. Per environment:

* broker to runner start: message sent -> the worker's runner starts (delivery, lease, flag);
* record to store: runner done -> record signed, sent, verified and appended by the coordinator.

Run: .venv/bin/python benchmarks/fleet_overhead.py [N]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from coordinator.dispatch import send_specs, watch_campaign, with_task_ids  # noqa: E402
from coordinator.fleet import STORED_AT_KEY  # noqa: E402
from coordinator.store import Store  # noqa: E402
from tasks.app import create_app  # noqa: E402
from tasks.records import EnvironmentSpec  # noqa: E402
from tests.fleet_helpers import OPS_APPENDFSYNC, Fleet, wait_until  # noqa: E402

DEFAULT_N = 40
CAMPAIGN = "c-bench-overhead"


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def run(n: int, root: Path) -> tuple[list[float], list[float], list[float]]:
    """Run ``n`` environments one by one; broker-to-start and record-to-store in ms."""
    fleet = Fleet(root, ["lab-a"])
    fleet.redis.appendfsync = OPS_APPENDFSYNC
    fleet.redis.start()
    app = create_app(fleet.redis.url())
    client = fleet.redis.client()
    try:
        fleet.register_hosts()
        fleet.start_worker("lab-a")
        fleet.start_coordinator()
        specs = with_task_ids([
            EnvironmentSpec(campaign=CAMPAIGN, host="lab-a", mode="native", workload="publish",
                            env_index=i, order_index=i, scale=0.02, rounds=1, limit_s=30,
                            work_root=str(root / "work"))
            for i in range(n)
        ])  # fmt: skip
        store = Store(fleet.data, signer=fleet.coordinator_key)
        store.create_campaign("", {}, specs)
        watch_campaign(app, CAMPAIGN)
        key = STORED_AT_KEY.format(campaign=CAMPAIGN)
        for spec in specs:
            send_specs(app, [spec], store.signer)
            wait_until(
                lambda s=spec: client.hexists(key, s.key()), 60, f"{spec.key()} stored", 0.002
            )
        stored = client.hgetall(key)
        to_start, to_store, delivery = [], [], []
        for record in store.records(CAMPAIGN, "lab-a"):
            f = record.fleet
            to_start.append((f["runner_start"] - f["sent_at"]) * 1e3)
            delivery.append((f["received_at"] - f["sent_at"]) * 1e3)
            to_store.append((float(stored[record.key()]) - f["runner_end"]) * 1e3)
        return to_start, to_store, delivery
    finally:
        client.close()
        app.close()
        fleet.close()


def main() -> None:
    """Print median and p95 of each overhead part and of their sum."""
    n = int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_N
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        start = time.monotonic()
        to_start, to_store, delivery = run(n, Path(tmp))
        took = time.monotonic() - start
    total = [a + b for a, b in zip(to_start, to_store, strict=True)]
    print(f"{len(total)} environments (native publish, scale 0.02, 1 round) in {took:.1f} s")
    for name, values in (("broker -> runner start", to_start), ("  of it: delivery", delivery),
                         ("record -> store", to_store),
                         ("orchestration overhead", total)):  # fmt: skip
        print(f"{name:24s} median {statistics.median(values):7.1f} ms   p95 {p95(values):7.1f} ms")


if __name__ == "__main__":
    main()
