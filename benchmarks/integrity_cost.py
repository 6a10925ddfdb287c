"""Benchmark: what signing and chaining cost, against the fleet's rates (issue 16's targets).

* spec signing: ``signed_spec_data`` per spec, what dispatch adds to each message; its rate must
  stay far above dispatch's target of 5,000 messages/s;
* ingest: ``Store.append_record`` one record at a time as the coordinator stores them (chain link
  signed, fsync per append), target 1,000 records/s; and the chaining alone (no fsync);
* verify: records checked per second by ``verify_campaign`` (bytes, two signatures, the chain).

Run: .venv/bin/python benchmarks/integrity_cost.py [N]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.records import EnvironmentRecord, EnvironmentSpec, RoundRecord  # noqa: E402
from contract.signing import CoordinatorKey, HostKey, sign_record  # noqa: E402
from contract.spec_signing import signed_spec_data  # noqa: E402
from coordinator.store.chain import linked_line  # noqa: E402
from coordinator.store.policy import verify_campaign  # noqa: E402
from coordinator.store.store import Store  # noqa: E402
from coordinator.store.trust import HostRegistry  # noqa: E402

DEFAULT_N = 3000
CID = "c-20261201-cost"
HOST = "lab-a"
DISPATCH_TARGET = 5000  # messages/s (issue 16)
INGEST_TARGET = 1000  # records/s (issue 16)


def specs(n: int) -> list[EnvironmentSpec]:
    """``n`` planned environments of one host."""
    return [EnvironmentSpec(campaign=CID, host=HOST, mode="native", workload="publish",
                            env_index=i, order_index=i, scale=0.02, task_id=f"{i:032x}",
                            work_root="/var/tmp/sandbench") for i in range(n)]  # fmt: skip


def records(planned: list[EnvironmentSpec], key: HostKey) -> list[EnvironmentRecord]:
    """A signed passed record per planned environment."""
    rounds = [RoundRecord(k=k, task_s=0.0123 * k, validated=True) for k in (1, 2, 3)]
    return [sign_record(EnvironmentRecord.from_spec(s, outcome="passed", ready_ms=21.5,
                                                    rounds=rounds, exit_code=0), key)
            for s in planned]  # fmt: skip


def rate(n: int, seconds: float) -> str:
    """``n`` in ``seconds`` as a per-second rate and a per-item cost."""
    return f"{n / seconds:,.0f}/s ({seconds / n * 1e6:.0f} us each)"


def main() -> None:
    """Print each figure beside its target, and the load it was measured under."""
    n = int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_N
    signer, host = CoordinatorKey.generate(), HostKey.generate(HOST)
    planned = specs(n)
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    t0 = time.perf_counter()
    for spec in planned:
        signed_spec_data(spec, signer)
    took = time.perf_counter() - t0
    print(f"spec signing: {rate(n, took)}; dispatch target {DISPATCH_TARGET:,}/s")
    signed = records(planned, host)
    t0 = time.perf_counter()
    for r in signed:
        linked_line(r.to_json_dict(), 1, "0" * 64, signer)
    print(f"chaining alone (link signed, line built): {rate(n, time.perf_counter() - t0)}")
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        store = Store(Path(tmp) / "data", signer=signer)
        store.create_campaign("", {}, planned)
        t0 = time.perf_counter()
        for r in signed:
            store.append_record(r)
        took = time.perf_counter() - t0
        print(f"ingest, one append (and fsync) per record: {rate(n, took)}; "
              f"target {INGEST_TARGET:,}/s")  # fmt: skip
        store.seal_host(CID, HOST, n)
        registry = HostRegistry(Path(tmp) / "hosts.json")
        registry.add(HOST, host.public_b64())
        registry.add_coordinator(signer.public_b64())
        t0 = time.perf_counter()
        checked = verify_campaign(store, CID, registry)
        took = time.perf_counter() - t0
        assert checked.ok, checked.problems[:3]
        print(f"verify: {rate(n, took)} ({checked.verdict.split(' (')[0]})")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
