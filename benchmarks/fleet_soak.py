"""Soak: a fleet campaign under faults, with nothing lost, nothing stored twice, nothing left.

Two workers, each in its own network namespace reaching a real redis-server (append-only, fsync
as in ops/redis.conf) over a veth pair, and the coordinator run a campaign of short
environments (native and staged, several workloads at scale 0.02, one round each). Meanwhile a
worker, picked at random, is killed with SIGKILL every 20-40 s (seeded) and started again at
once; redis-server is killed and restarted once when 40% of the records are stored, the
coordinator once at 60%. Printed beside its target: planned, stored, duplicates stored, lost,
the mounts, cgroups and processes left after the run, verify's verdict; and the wall time.
Exit status 1 when a target is missed (2 for bad arguments).

Run (as root): .venv/bin/python benchmarks/fleet_soak.py [--environments 300] [--seed 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import redis  # noqa: E402

from coordinator.fleet.status import campaign_status  # noqa: E402
from coordinator.store.store import Store  # noqa: E402
from tests.fleet_helpers import Fleet, dispatch, write_plan  # noqa: E402
from tests.leftovers import hold, holding_python, leftovers  # noqa: E402

HOSTS = ["lab-a", "lab-b"]
MODES = ["native", "staged"]
WORKLOADS = ["publish", "seq-write", "create-small", "rename-atomic", "stat-tree"]
REDIS_AT, COORDINATOR_AT = 0.4, 0.6  # fractions of the records stored
POLL_S = 1.0
PYTHON_ENV = "SANDBENCH_PYTHON"  # the payload's interpreter (--hold-s: one that waits first)
BOUND_S = 3600.0  # a soak that has not finished by then has failed (--bound-s)
# Delivery clocks of the soak (production: 900 s visibility, 600 s grace, 300 s lease slack).
VISIBILITY_S, RESTORE_S, LOST_GRACE_S, LEASE_SLACK_S, LIMIT_S = 10, 2, 60, 30, 60


class SoakFleet(Fleet):
    """A test fleet with the soak's delivery clocks."""

    def env(self, home: Path, broker: str) -> dict[str, str]:
        """Environment of one fleet process."""
        env = super().env(home, broker)
        env.update(
            SANDBENCH_VISIBILITY_TIMEOUT=str(VISIBILITY_S),
            SANDBENCH_RESTORE_INTERVAL=str(RESTORE_S),
            SANDBENCH_LOST_GRACE=str(LOST_GRACE_S),
            SANDBENCH_LEASE_SLACK=str(LEASE_SLACK_S),
        )
        return env


@dataclass
class Faults:
    """The faults injected so far."""

    kills: list[str] = field(default_factory=list)
    redis_restarts: int = 0
    coordinator_restarts: int = 0

    def injected(self) -> bool:
        """Whether every kind of fault happened mid-campaign (else the soak proved little)."""
        return bool(self.kills) and self.redis_restarts == self.coordinator_restarts == 1


def stored_count(fleet: Fleet, campaign: str) -> int:
    """Record lines stored so far, every host."""
    store = Store(fleet.data)
    total = 0
    for host in HOSTS:
        path = store.records_path(campaign, host)
        total += sum(1 for line in path.read_text().splitlines() if line) if path.exists() else 0
    return total


def campaign_state(fleet: Fleet, campaign: str) -> dict[str, Any]:
    """``sandbench status --json`` of the campaign, computed in this process."""
    client = redis.Redis.from_url(fleet.redis.url(), decode_responses=True, socket_timeout=5)
    try:
        return campaign_status(Store(fleet.data), client, campaign)
    finally:
        client.close()


def finished(fleet: Fleet, campaign: str) -> bool:
    """Whether every host is finalized (False while the broker restarts)."""
    try:
        return bool(campaign_state(fleet, campaign)["finished"])
    except (redis.RedisError, OSError):
        return False


def run_with_faults(fleet: Fleet, campaign: str, planned: int, args: argparse.Namespace) -> Faults:
    """Inject the faults until the campaign is finished (or the bound passes)."""
    rng = random.Random(args.seed)
    faults = Faults()
    low, high = args.kill_every
    start = time.monotonic()
    next_kill = start + rng.uniform(low, high)
    while not finished(fleet, campaign):
        now = time.monotonic()
        if now - start > args.bound_s:
            break
        done = stored_count(fleet, campaign) / planned
        if now >= next_kill and len(faults.kills) < args.max_kills:
            name = rng.choice(HOSTS)
            fleet.workers[name].kill9()
            fleet.start_worker(name)
            faults.kills.append(f"{now - start:.0f}s:{name}")
            next_kill = time.monotonic() + rng.uniform(low, high)
        elif done >= REDIS_AT and not faults.redis_restarts:
            fleet.redis.restart(down_s=2.0)
            faults.redis_restarts += 1
        elif done >= COORDINATOR_AT and not faults.coordinator_restarts:
            assert fleet.coordinator is not None
            fleet.coordinator.kill9()
            fleet.start_coordinator()
            faults.coordinator_restarts += 1
        time.sleep(POLL_S)
    return faults


def figures(fleet: Fleet, campaign: str) -> dict[str, object]:
    """What the run left: counts from the store, the status, the hosts and verify."""
    store = Store(fleet.data)
    keys = [r.key() for host in HOSTS for r in store.records(campaign, host)]
    final = campaign_state(fleet, campaign)
    left = {"mounts": 0, "cgroups": 0, "processes": 0, "files": 0}
    for host in fleet.hosts.values():
        for kind, items in leftovers(host.work_root, campaign).items():
            left[kind] += len(items)
    records = [r for host in HOSTS for r in store.records(campaign, host)]
    verify = fleet.cli("verify", campaign, "--data", str(fleet.data))
    return {
        "planned": sum(h["planned"] for h in final["hosts"]),
        "stored": len(set(keys)),
        "duplicates": len(keys) - len(set(keys)),
        "lost": sum(h["lost"] for h in final["hosts"]),
        **{f"leftover {kind}": n for kind, n in left.items()},
        "verify": "passed" if verify.returncode == 0 else "FAILED",
        "verify_output": verify.stdout.strip().splitlines()[-1:] + verify.stderr.splitlines()[-3:],
        "passed": sum(1 for r in records if r.outcome == "passed"),
        "lost runs (run again)": sum(int((r.fleet or {}).get("lost_runs", 0)) for r in records),
        "duplicate records dropped": sum(h.get("duplicates", 0) for h in final["hosts"]),
        "queued again": sum(h.get("requeued", 0) for h in final["hosts"]),
        "finished": final["finished"],
    }


def report(result: dict[str, object], faults: Faults, wall_s: float) -> bool:
    """Print every figure beside its target; True when every target is met."""
    planned = result["planned"]
    targets: list[tuple[str, object, object]] = [
        ("planned", planned, planned), ("stored", result["stored"], planned),
        ("duplicates stored", result["duplicates"], 0), ("lost", result["lost"], 0),
        ("leftover mounts", result["leftover mounts"], 0),
        ("leftover cgroups", result["leftover cgroups"], 0),
        ("leftover processes", result["leftover processes"], 0),
        ("leftover workspaces", result["leftover files"], 0),
        ("verify", result["verify"], "passed"), ("finished", result["finished"], True),
        ("faults injected", faults.injected(), True),
    ]  # fmt: skip
    print(f"{'figure':28s} {'value':>10s} {'target':>10s}")
    ok = True
    for name, value, target in targets:
        met = value == target
        ok = ok and met
        print(f"{name:28s} {value!s:>10s} {target!s:>10s}{'' if met else '   MISSED'}")
    print(f"{'wall time':28s} {wall_s:>9.1f}s {'-':>10s}")
    for name in ("passed", "lost runs (run again)", "duplicate records dropped", "queued again"):
        print(f"{name:28s} {result[name]!s:>10s} {'(info)':>10s}")
    print(f"faults: {len(faults.kills)} worker kill -9 ({', '.join(faults.kills)}), "
          f"{faults.redis_restarts} redis restart, "
          f"{faults.coordinator_restarts} coordinator restart")  # fmt: skip
    if result["verify"] != "passed":
        print("verify said:", *result["verify_output"], sep="\n  ")  # type: ignore[misc]
    return ok


def close(fleet: Fleet) -> None:
    """Stop every process of the fleet, whatever fails on the way (nothing may outlive it)."""
    for proc in fleet.procs:
        with contextlib.suppress(Exception):
            proc.kill9()
    fleet.close()


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (a timeout, Ctrl-C's cousin): unwind, so the fleet is stopped on the way out."""
    raise SystemExit(f"fleet_soak: stopped by signal {signum}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The soak's arguments."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--environments", type=int, default=300, help="total, both hosts")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kill-every", type=float, nargs=2, default=(20.0, 40.0),
                        metavar=("LOW", "HIGH"), help="seconds between worker kills")  # fmt: skip
    parser.add_argument("--max-kills", type=int, default=10**6, help="stop killing after this many")
    parser.add_argument("--hold-s", type=float, default=0.0,
                        help="each environment waits this long before Ready (a short smoke "
                             "still meets every fault mid-campaign)")  # fmt: skip
    parser.add_argument("--bound-s", type=float, default=BOUND_S,
                        help="give up (and report) after this many seconds")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args(argv)
    cells = len(HOSTS) * len(MODES) * len(WORKLOADS)
    if args.environments < cells or args.environments % cells:
        parser.error(f"--environments must be a multiple of {cells} (hosts x modes x workloads)")
    if not 0 < args.kill_every[0] <= args.kill_every[1]:
        parser.error("--kill-every LOW HIGH: 0 < LOW <= HIGH")
    return args


def main(argv: list[str]) -> int:
    """Run the soak; 0 when every target is met."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    per_cell = args.environments // (len(HOSTS) * len(MODES) * len(WORKLOADS))
    print(f"fleet soak: {len(HOSTS)} workers in network namespaces, {args.environments} "
          f"environments ({', '.join(MODES)} x {', '.join(WORKLOADS)} at scale 0.02, 1 round), "
          f"seed {args.seed}, a worker killed every {args.kill_every[0]:g}-"
          f"{args.kill_every[1]:g} s")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="sb-soak-") as tmp:
        root = Path(tmp)
        if args.hold_s:
            os.environ[PYTHON_ENV] = str(holding_python(root))
        fleet = SoakFleet(root, HOSTS, netns_prefix=f"sbs{int(time.time()) % 10000}")
        try:
            fleet.redis.start()
            fleet.register_hosts()
            for name in HOSTS:
                hold(fleet.hosts[name].work_root, args.hold_s)
                fleet.start_worker(name)
            fleet.start_coordinator()
            plan = write_plan(
                root / "plan.toml", environments=per_cell, rounds=1, modes=MODES,
                workloads=WORKLOADS, limit_s=LIMIT_S, sentinel=False, seed=args.seed,
            )  # fmt: skip
            start = time.monotonic()
            campaign = dispatch(fleet, plan, ",".join(HOSTS))
            faults = run_with_faults(fleet, campaign, args.environments, args)
            wall_s = time.monotonic() - start
            result = figures(fleet, campaign)
        finally:
            close(fleet)
    ok = report(result, faults, wall_s)
    if args.json:
        print(json.dumps({**result, "wall_s": wall_s, "kills": faults.kills}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
