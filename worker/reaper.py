"""The reaper: remove what earlier environments of one work root left behind, item by item.

A worker reaps its work root before it takes its first message and after an environment whose
cleanup failed; ``sandbench host clean`` reaps on demand. What is reaped, in this order (each
item logged):

1. containers on the private docker daemon and podman store labelled ``sandbench.env`` whose
   workspace mount lies in one of this work root's environments;
2. processes named by a pid file in an environment's directory (QEMU's ``qemu.pid``, conmon's),
   killed only if their command line names that very pid file;
3. the environments' cgroups in every mounted hierarchy (v1 and v2), their processes first,
   deepest cgroup first (virtiofsd, which vm-virtiofs starts inside, goes with them);
4. virtiofsd's lock file of an environment's socket in ``/run/virtiofsd``, which outlives it;
5. mounts below ``envs/`` (from ``/proc/self/mountinfo``), deepest first;
6. the environments' directories (workspaces, stages, images) and their ledger entries.

Ownership comes from the work root alone: an environment is this work root's if the ledger
(``worker.ledger``) names it or ``envs/<name>`` exists; cgroup names are the environments'
names, containers are matched by label and mount source. An environment whose creator still
runs is left alone, so a second worker's (or a ``sandbench run``'s) live environment is never
touched, and nothing outside the work root, its cgroups and its labelled containers is.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from contract.errors import SandbenchError
from worker import ledger
from worker.cgroups import PARENT_NAME, Cgroup, cgroup_mounts, detect
from worker.procs import kill_and_wait
from worker.vm import virtiofs
from worker.workroot import remove_tree

log = logging.getLogger("sandbench.reaper")

CONTAINER_LABEL = "sandbench.env"  # set on every container of the docker and podman modes
PIDFILE_SUFFIX = ".pid"
KILL_WAIT_S = 5.0
POLL_S = 0.02
STALE_TEMPORARY_S = 60.0  # a half-written ledger entry older than this has no writer left
MNT_DETACH = 2
MOUNT_ROUNDS = 4


@dataclass
class Reaped:
    """What one reaping found and removed."""

    work_root: Path
    items: list[tuple[str, str]] = field(default_factory=list)  # (kind, what)
    skipped: list[str] = field(default_factory=list)  # live environments left alone
    problems: list[str] = field(default_factory=list)

    def add(self, kind: str, what: str) -> None:
        """Note and log one removed item."""
        self.items.append((kind, what))
        log.info("reaped %s %s", kind, what)

    def problem(self, what: str) -> None:
        """Note and log something that could not be removed."""
        self.problems.append(what)
        log.error("reaper: %s", what)

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``host clean --json``)."""
        return {
            "work_root": str(self.work_root),
            "reaped": [{"kind": k, "what": w} for k, w in self.items],
            "skipped": self.skipped,
            "problems": self.problems,
        }

    def lines(self) -> list[str]:
        """One line per item, skipped environment and problem, then a summary."""
        out = [f"reaped {kind} {what}" for kind, what in self.items]
        out += [f"left alone (its process still runs): {name}" for name in self.skipped]
        out += [f"could not reap: {p}" for p in self.problems]
        out.append(f"{self.work_root}: {len(self.items)} leftover(s) reaped, "
                   f"{len(self.problems)} problem(s)")  # fmt: skip
        return out


class Engine(Protocol):
    """A container engine sandbench owns (the private dockerd, the private podman store)."""

    def run(self, *args: str, input: bytes | None = None, timeout: float = ...) -> str:
        """Run one client command; its stdout."""
        ...


def reap(work_root: Path, engines: list[tuple[str, Engine]] | None = None) -> Reaped:
    """Remove every leftover of ``work_root``'s dead environments; what was removed."""
    work_root = work_root.resolve()
    result = Reaped(work_root)
    owned = ledger.entries(work_root)
    envs = work_root / ledger.ENVS_DIR
    dirs = {p.name for p in envs.iterdir() if p.is_dir()} if envs.is_dir() else set()
    live = {name for name, entry in owned.items() if entry.live()}
    result.skipped = sorted(live)
    dead = sorted((owned.keys() | dirs) - live)
    if dead:
        engines = default_engines() if engines is None else engines
        for kind, engine in engines:
            reap_containers(kind, engine, envs, set(dead), result)
    for name in dead:
        reap_environment(work_root, name, owned.get(name), result)
    for tmp in ledger.stale_temporaries(work_root):
        with contextlib.suppress(OSError):
            if time.time() - tmp.stat().st_mtime > STALE_TEMPORARY_S:
                tmp.unlink()
    return result


def reap_if_left(work_root: Path) -> Reaped | None:
    """Reap ``work_root`` if an environment's cleanup left its ledger entry (else None, at once).

    Called between environments: a reaper that fails is logged, never raised, so the record
    of the environment just run is still handed over.
    """
    try:
        if all(entry.live() for entry in ledger.entries(work_root).values()):
            return None
        result = reap(work_root)
    except (OSError, SandbenchError) as exc:
        log.error("reaper failed on %s: %s", work_root, exc)  # noqa: TRY400 -- says what
        return None
    log.warning("%s", result.lines()[-1])
    return result


def reap_environment(
    work_root: Path, name: str, entry: ledger.Entry | None, result: Reaped
) -> None:
    """Pid files, cgroups, mounts and the directory of one dead environment, then its entry."""
    before = len(result.problems)
    base = work_root / ledger.ENVS_DIR / name
    kill_pidfiles(base, result)
    for cgroup in environment_cgroups(name, entry):
        reap_cgroup(cgroup, result)
    remove_virtiofsd_lock(name, result)
    for _ in range(MOUNT_ROUNDS):  # a point mounted over twice shows again after one umount
        points = mounts_below(base)
        for point in points:
            errno = _umount(point)
            if errno:
                result.problem(f"umount {point}: {os.strerror(errno)}")
            else:
                result.add("mount", point)
        if not points or len(result.problems) > before:
            break
    if os.path.lexists(base):
        try:
            problems = remove_tree(base, work_root)
        except SandbenchError as exc:
            problems = [str(exc)]
        for p in problems:
            result.problem(p)
        if not problems:
            result.add("workspace", str(base))
    if len(result.problems) == before:
        ledger.release(work_root, name)


# -- containers ---------------------------------------------------------------------------
def default_engines() -> list[tuple[str, Engine]]:
    """The private dockerd (if it answers) and the private podman store (if it exists)."""
    from worker.dockerd import Dockerd
    from worker.podman import Podman, find_binary

    found: list[tuple[str, Engine]] = []
    daemon = Dockerd()
    if daemon.socket.exists() and daemon.ping():
        found.append(("docker", daemon))
    store = Podman()
    if store.state_dir.is_dir() and find_binary(store.podman) is not None:
        found.append(("podman", store))
    return found


def reap_containers(kind: str, engine: Engine, envs: Path, dead: set[str], result: Reaped) -> None:
    """Remove ``kind``'s labelled containers whose mounts lie in a dead environment of ``envs``."""
    try:
        ids = engine.run("ps", "--all", "--quiet", f"--filter=label={CONTAINER_LABEL}").split()
        details = json.loads(engine.run("inspect", *ids)) if ids else []
    except (SandbenchError, ValueError) as exc:
        result.problem(f"{kind}: cannot list containers: {exc}")
        return
    for container in details:
        owner = _owner(container, envs)
        if owner is None or owner not in dead:
            continue
        name = str(container.get("Name", "")).lstrip("/") or str(container.get("Id"))[:12]
        try:
            engine.run("rm", "--force", "--volumes", str(container["Id"]))
        except SandbenchError as exc:
            result.problem(f"{kind} container {name}: {exc}")
            continue
        result.add(f"{kind}-container", f"{name} (environment {owner})")


def _owner(container: dict[str, Any], envs: Path) -> str | None:
    """The environment (name under ``envs``) whose directory a container's mount comes from."""
    for mount in container.get("Mounts") or []:
        source = Path(str(mount.get("Source", "")))
        if envs in source.parents:
            return source.relative_to(envs).parts[0]
    return None


# -- processes by pid file ----------------------------------------------------------------
def kill_pidfiles(base: Path, result: Reaped) -> None:
    """Kill each process named by a pid file in ``base/env`` whose command line names the file."""
    env_dir = base / "env"
    for pidfile in sorted(env_dir.glob(f"*{PIDFILE_SUFFIX}")) if env_dir.is_dir() else []:
        try:
            pid = int(pidfile.read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # no such process (or no pid): nothing runs from this file
        if not any(arg.endswith(str(pidfile).encode()) for arg in cmdline):
            continue  # the pid was reused by a process that is not ours
        name = cmdline[0].decode(errors="replace").rsplit("/", 1)[-1]
        if kill_and_wait(pid, KILL_WAIT_S):
            result.add("process", f"{pid} {name} (pid file {pidfile})")
        else:
            result.problem(f"process {pid} ({pidfile}) survives SIGKILL")


# -- cgroups ------------------------------------------------------------------------------
def environment_cgroups(name: str, entry: ledger.Entry | None) -> list[Cgroup]:
    """The cgroups environment ``name`` may have: the ledger's path, else where runners put them."""
    from worker.cgroups import new_cgroup
    from worker.cgroups.v1 import CgroupV1
    from worker.cgroups.v2 import CgroupV2

    if entry is not None:
        paths = {(entry.cgroup, entry.cgroup_version)}
    else:  # a directory without an entry: the layouts this host's runner would have used
        version = detect()
        paths = {(f"/{PARENT_NAME}/{name}", version), (new_cgroup(name, version).path, version)}
    return [CgroupV1(path) if version == 1 else CgroupV2(path) for path, version in sorted(paths)]


def reap_cgroup(cgroup: Cgroup, result: Reaped) -> None:
    """Kill the processes of ``cgroup`` and its children in every hierarchy, then remove them."""
    dirs = hierarchy_dirs(cgroup.path)
    if not dirs:
        return
    pids = _pids(dirs)
    try:
        cgroup.kill()  # the abstraction: v1 freezes first, v2 writes cgroup.kill
    except SandbenchError as exc:
        result.problem(str(exc))
    for directory in dirs:  # what the abstraction does not cover (a container's own cgroups)
        for pid in _procs(directory):
            if not kill_and_wait(pid, KILL_WAIT_S):
                result.problem(f"process {pid} in {directory} survives SIGKILL")
    for pid, comm in pids:
        result.add("process", f"{pid} {comm} (cgroup {cgroup.path})")
    for directory in dirs:
        try:
            _rmdir(directory)
        except OSError as exc:
            result.problem(f"cgroup {directory}: {exc.strerror}")
            continue
        result.add("cgroup", str(directory))


def hierarchy_dirs(path: str) -> list[Path]:
    """The directories of cgroup ``path`` and of every cgroup below it, in every mounted
    hierarchy (v1 controllers, named ones, the unified one), deepest first."""
    rel = path.strip("/")
    found: list[Path] = []
    for point in sorted(set(cgroup_mounts().values())):
        top = point / rel
        if rel and top.is_dir():
            found += [Path(d) for d, _subdirs, _files in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _procs(directory: Path) -> list[int]:
    """Pids listed in one cgroup's ``cgroup.procs``."""
    try:
        return [int(pid) for pid in (directory / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _pids(dirs: list[Path]) -> list[tuple[int, str]]:
    """Every process in ``dirs``, once, with its command name."""
    pids = sorted({pid for directory in dirs for pid in _procs(directory)})
    out = []
    for pid in pids:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            comm = "?"
        out.append((pid, comm))
    return out


def _rmdir(directory: Path) -> None:
    """Remove an empty cgroup, retrying while the kernel releases exited tasks."""
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        try:
            directory.rmdir()
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL_S)
        else:
            return


# -- files outside the work root -----------------------------------------------------------
def remove_virtiofsd_lock(name: str, result: Reaped) -> None:
    """The lock file virtiofsd keeps for environment ``name``'s socket (its name is the
    environment's), once the cgroup's reaping has ended the daemon."""
    lock = virtiofs.lock_file(virtiofs.socket_name(name))
    try:
        lock.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        result.problem(f"{lock}: {exc.strerror}")
        return
    result.add("file", str(lock))


# -- mounts -------------------------------------------------------------------------------
def mounts_below(path: Path) -> list[str]:
    """Mount points at or below ``path``, deepest first (each listed once)."""
    prefix = str(path)
    points = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            points.add(point)
    return sorted(points, key=lambda p: (p.count("/"), p), reverse=True)


def _umount(point: str) -> int:
    """Detach the mount at ``point``; 0, or the errno of the failure."""
    libc = ctypes.CDLL(None, use_errno=True)
    return 0 if libc.umount2(point.encode(), MNT_DETACH) == 0 else ctypes.get_errno()
