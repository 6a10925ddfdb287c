"""Benchmark: the store-driven finalizer on one host with 100,000 signed records.

Builds a campaign of 100,016 planned environments (4 modes x 19 workloads x 1,316
environments, 3 rounds each) with one signed record per environment written to
records.jsonl, then times ``Coordinator.finalize``: planned versus received set from the store,
the first-failure rule re-applied, per-host statistics, results.csv and the report.

Run: .venv/bin/python benchmarks/fleet_finalize.py
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from coordinator.campaign import expand  # noqa: E402
from coordinator.fleet import Coordinator  # noqa: E402
from coordinator.plan import parse_plan  # noqa: E402
from coordinator.progress import host_progress  # noqa: E402
from coordinator.registry import HostRegistry  # noqa: E402
from coordinator.store import Store  # noqa: E402
from tasks.app import create_app  # noqa: E402
from tasks.records import EnvironmentRecord, RoundRecord  # noqa: E402
from tasks.signing import CoordinatorKey, HostKey, sign_record  # noqa: E402
from tests.fleet_helpers import OPS_APPENDFSYNC, RedisServer  # noqa: E402

PLAN = """
name = "finalizer-benchmark"
seed = 3
environments = 1316
rounds = 3
workloads = ["all"]
modes = ["native", "host", "staged", "docker"]
"""
HOST = "lab-a"
CAMPAIGN = "c-bench-finalize"


def write_records(store: Store, key: HostKey) -> int:
    """One signed passed record per planned environment, appended as the store writes them."""
    specs = store.load_campaign(CAMPAIGN).host_specs(HOST)
    rng = random.Random(1)
    path = store.records_path(CAMPAIGN, HOST)
    with open(path, "w") as f:
        for spec in specs:
            rounds = [RoundRecord(k=k, task_s=rng.uniform(0.05, 0.5), validated=True)
                      for k in range(1, 4)]  # fmt: skip
            record = EnvironmentRecord.from_spec(
                spec, outcome="passed", ready_ms=rng.uniform(10, 60), rounds=rounds, exit_code=0
            )
            line = sign_record(record, key).to_json_dict()
            f.write(json.dumps(line, separators=(",", ":"), sort_keys=True) + "\n")
    return len(specs)


def main() -> None:
    """Print the time to build the store and the finalizer's time."""
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        root = Path(tmp)
        server = RedisServer(root / "redis", appendfsync=OPS_APPENDFSYNC)
        server.start()
        app = create_app(server.url())
        try:
            store = Store(root / "data", signer=CoordinatorKey.generate())
            plan = parse_plan(PLAN)
            store.create_campaign(PLAN, plan, expand(plan, [HOST], CAMPAIGN, str(root / "w")))
            key = HostKey.generate(HOST)
            registry = HostRegistry(root / "hosts.json")
            registry.add(HOST, key.public_b64())
            t0 = time.perf_counter()
            n = write_records(store, key)
            built = time.perf_counter() - t0
            coordinator = Coordinator(store, registry, server.client(), app)
            t0 = time.perf_counter()
            complete = host_progress(store, CAMPAIGN, HOST).complete()  # keys only
            progress_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            host_progress(store, CAMPAIGN, HOST).complete()  # as after each stored record
            warm_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            result = coordinator.finalize(CAMPAIGN, HOST)
            finalize_s = time.perf_counter() - t0
            coordinator.client.close()
        finally:
            app.close()
            server.stop()
    assert complete and result["finalized"], result
    print(f"{n} records of one host (signed, 3 rounds each) written in {built:.1f} s")
    print(f"completeness check (planned vs received set from the store): {progress_s:.2f} s "
          f"cold, {warm_s:.2f} s warm (campaign cached, keys read incrementally)")  # fmt: skip
    print(f"finalize_host (rule, statistics, results.csv, report): {finalize_s:.2f} s")


if __name__ == "__main__":
    main()
