"""Benchmark: coordinator ingest, records stored and verified per second from 200 hosts.

A real redis-server (ops/redis.conf's fsync policy) and a real coordinator process (``sandbench
coordinator``, its registry trusting 200 host keys); no environment runs. A load generator
holds one record per planned environment of a campaign of 200 hosts (10 workloads x 15
environments each, plus the sentinel's points), each signed by its host's key, and sends them
through the real ``store_record`` task path: one task message per record on queue
``records``, written as a lab host's hand-over writes it (``contract.outbox.add_record``), taken by
the coordinator's intake (``coordinator.fleet.intake``: batches, group commit). A first campaign is
queued all at once: records stored per second (the coordinator's capacity) beside the target.
A second is offered at ``RATE`` records per second in small batches (each host's records in
its run order, hosts interleaved), each record's send time taken when its batch is queued; the
coordinator notes when each was durably appended (``sandbench:stored-at``): the delay from send
to durable append, median and p95. Nothing lost: each campaign's stored records are counted,
every host is finalized and ``sandbench verify`` checks signatures, chains, heads and the rule.

Run: .venv/bin/python benchmarks/fleet_ingest.py
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.app import create_app  # noqa: E402
from contract.broker import HOST_ALIVE_KEY, HOST_ALIVE_REFRESH_S, HOST_ALIVE_TTL_S  # noqa: E402
from contract.outbox import Outbox, add_record  # noqa: E402
from contract.records import EnvironmentRecord, RoundRecord  # noqa: E402
from contract.signing import COORDINATOR_KEY_FILE, HostKey, sign_record  # noqa: E402
from coordinator.fleet.coordinator import FINALIZED_KEY, REJECTED_KEY, STORED_AT_KEY  # noqa: E402
from coordinator.fleet.dispatch import watch_campaign, with_task_ids  # noqa: E402
from coordinator.plan.campaign import expand  # noqa: E402
from coordinator.plan.file import parse_plan  # noqa: E402
from coordinator.store.store import Store  # noqa: E402
from coordinator.store.trust import HostRegistry, own_coordinator_key  # noqa: E402
from tests.fleet_helpers import PYTHON, Proc, RedisServer, wait_until  # noqa: E402

HOSTS = [f"lab-{i:03d}" for i in range(200)]
PLAN = """
name = "ingest-benchmark"
seed = 5
environments = 15
rounds = 3
workloads = ["seq-write", "sync-write", "create-small", "read-small", "stat-tree",
             "readdir-wide", "rename-atomic", "append-fsync", "delete-tree", "publish"]
modes = ["native"]
"""
RATE = 1000  # records offered per second
BATCH_S = 0.02  # a batch of RATE * BATCH_S records every BATCH_S seconds
TARGET_PER_S = 1000


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def records(store: Store, campaign: str, keys: dict[str, HostKey]) -> list[dict[str, Any]]:
    """One passed record per planned environment, signed by its host, hosts interleaved."""
    specs = store.load_campaign(campaign).specs
    per_host = {h: sorted((s for s in specs if s.host == h), key=lambda s: s.order_index)
                for h in HOSTS}  # fmt: skip
    out = []
    for i in range(max(len(v) for v in per_host.values())):
        for host in HOSTS:
            if i < len(per_host[host]):
                spec = per_host[host][i]
                rounds = [
                    RoundRecord(k=k, task_s=0.1 + 0.01 * k, validated=True) for k in (1, 2, 3)
                ]
                record = EnvironmentRecord.from_spec(
                    spec, outcome="passed", ready_ms=20.0, rounds=rounds, exit_code=0
                )
                out.append(sign_record(record, keys[host]).to_json_dict())
    return out


def keep_alive(client: Any, stop: threading.Event) -> None:
    """Keep every host's alive key fresh, as their running workers would (no lease expires)."""
    while True:
        pipe = client.pipeline(transaction=False)
        for host in HOSTS:
            pipe.set(HOST_ALIVE_KEY.format(host=host), "1", ex=HOST_ALIVE_TTL_S)
        pipe.execute()
        if stop.wait(HOST_ALIVE_REFRESH_S):
            return


def campaign(store: Store, cid: str, app: Any) -> None:
    """Store campaign ``cid`` (200 hosts) and have the coordinator watch it."""
    plan = parse_plan(PLAN)
    store.create_campaign(PLAN, plan, with_task_ids(expand(plan, HOSTS, cid, "/var/tmp/sb")))
    watch_campaign(app, cid)


def send(app: Any, batch: list[dict[str, Any]], outbox: Outbox) -> float:
    """Queue ``batch`` as lab hosts hand records over (``add_record``); when it was queued."""
    for record in batch:
        add_record(outbox, record)
    outbox.flush()
    return time.time()


def paced(app: Any, recs: list[dict[str, Any]]) -> dict[str, float]:
    """Offer ``recs`` at ``RATE`` per second; each record's send time by key."""
    per_batch = max(1, int(RATE * BATCH_S))
    sent: dict[str, float] = {}
    start = time.monotonic()
    with Outbox(app) as outbox:
        for n, i in enumerate(range(0, len(recs), per_batch)):
            time.sleep(max(0.0, start + n * BATCH_S - time.monotonic()))
            batch = recs[i : i + per_batch]
            at = send(app, batch, outbox)
            sent.update((key_of(r), at) for r in batch)
    return sent


def key_of(record: dict[str, Any]) -> str:
    """A record's idempotency key."""
    return "/".join(str(record[p]) for p in ("campaign", "host", "mode", "workload", "env_index",
                                             "attempt"))  # fmt: skip


def stored(client: Any, cid: str, n: int, timeout: float) -> dict[str, float]:
    """Wait until ``n`` records of ``cid`` are stored; their stored-at times by key."""
    key = STORED_AT_KEY.format(campaign=cid)
    wait_until(lambda: client.hlen(key) >= n, timeout, f"{n} records of {cid} stored", 0.1)
    return {k: float(v) for k, v in client.hgetall(key).items()}


def check(store: Store, client: Any, cid: str, n: int, home: Path, data: Path) -> str:
    """Nothing lost: counts, every host finalized, verify; one line."""
    lines = sum(len(store.log_lines(cid, h)) for h in HOSTS)
    rejected = client.llen(REJECTED_KEY.format(campaign=cid))
    finalized = FINALIZED_KEY.format(campaign=cid)
    wait_until(lambda: client.hlen(finalized) == len(HOSTS), 600, f"{cid}'s hosts finalized", 0.5)
    env = {**os.environ, "SANDBENCH_HOME": str(home)}
    argv = [PYTHON, "-m", "coordinator", "verify", cid, "--data", str(data)]
    out = subprocess.run(argv, env=env, cwd=REPO, check=False, capture_output=True, text=True)
    verdict = (out.stdout + out.stderr).strip().splitlines()[-1]
    assert lines == n and rejected == 0 and out.returncode == 0, (lines, n, rejected, verdict)
    return (
        f"{lines} of {n} records in the store, {rejected} rejected, all hosts finalized; {verdict}"
    )


def main() -> None:
    """Print ingest throughput and delay beside the targets, then capacity and the checks."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a stopped run still stops its parts
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        root = Path(tmp)
        home, data = root / "coordinator-home", root / "data"
        coordinator_key = own_coordinator_key(home / COORDINATOR_KEY_FILE)
        keys = {h: HostKey.generate(h) for h in HOSTS}
        registry = HostRegistry(home / "hosts.json")
        for host, key in keys.items():
            registry.add(host, key.public_b64())
        server = RedisServer(root / "redis")  # appendfsync always, as ops/redis.conf
        server.start()
        app = create_app(server.url())
        client = server.client()
        env = {**os.environ, "SANDBENCH_HOME": str(home), "SANDBENCH_BROKER": server.url(),
               "PYTHONUNBUFFERED": "1"}  # fmt: skip
        proc = Proc([PYTHON, "-m", "coordinator", "coordinator", "--data", str(data)], env,
                    root / "coordinator.log")  # fmt: skip
        stop = threading.Event()
        alive = threading.Thread(target=keep_alive, args=(server.client(), stop), daemon=True)
        try:
            alive.start()
            wait_until(lambda: " ready." in proc.text() or not proc.alive(), 60, "coordinator")
            store = Store(data, signer=coordinator_key)
            campaign(store, "c-ingest-burst", app)  # each stored just before it is sent:
            burst_recs = records(store, "c-ingest-burst", keys)  # its leases stay in bounds
            with Outbox(app, batch=len(burst_recs)) as outbox:
                burst_at = send(app, burst_recs, outbox)
            burst = stored(client, "c-ingest-burst", len(burst_recs), 600)
            burst_line = check(store, client, "c-ingest-burst", len(burst_recs), home, data)
            campaign(store, "c-ingest-paced", app)
            paced_recs = records(store, "c-ingest-paced", keys)
            sent = paced(app, paced_recs)
            got = stored(client, "c-ingest-paced", len(paced_recs), 300)
            paced_line = check(store, client, "c-ingest-paced", len(paced_recs), home, data)
        finally:
            stop.set()
            proc.stop()
            client.close()
            app.close()
            server.stop()
    report(sent, got, burst_at, burst, paced_line, burst_line)


def report(
    sent: dict[str, float], got: dict[str, float], burst_at: float, burst: dict[str, float],
    paced_line: str, burst_line: str,
) -> None:  # fmt: skip
    """Print the figures beside their targets."""
    delays = [(got[k] - t) * 1e3 for k, t in sent.items()]
    if os.environ.get("INGEST_DUMP"):  # send time and delay of each record, for a closer look
        with open(os.environ["INGEST_DUMP"], "w") as f:
            t0 = min(sent.values())
            f.writelines(
                f"{t - t0:.3f} {(got[k] - t) * 1e3:.1f}\n"
                for k, t in sorted(sent.items(), key=lambda kv: kv[1])
            )
    took = max(burst.values()) - burst_at
    capacity = len(burst) / took
    verdict = "met" if capacity >= TARGET_PER_S else "MISSED"
    print(f"{len(HOSTS)} hosts, signed records through store_record (queue records, the "
          f"coordinator's intake), redis appendfsync always; load average "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"stored and verified: {capacity:.0f} records/s ({len(burst)} queued at once, all "
          f"stored in {took:.1f} s; target >= {TARGET_PER_S}: {verdict})")  # fmt: skip
    print(f"  {burst_line}")
    kept = len(sent) / (max(got.values()) - min(sent.values()))
    print(f"at {RATE} records/s offered ({len(sent)} records; 5,000 hosts each finishing one "
          f"environment every 5 s): {kept:.0f} records/s stored; send -> durable append "
          f"median {statistics.median(delays):.1f} ms, p95 {p95(delays):.1f} ms")  # fmt: skip
    print(f"  {paced_line}")


if __name__ == "__main__":
    main()
