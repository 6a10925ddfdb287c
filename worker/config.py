"""A fleet worker's own configuration: the coordinator key it trusts, the command modes it allows.

Both are the lab host's decision, never a spec's. They live in ``/etc/sandbench/`` (written by
``ops/install.sh --role worker``) or in ``$SANDBENCH_HOME`` (tests, compose), the first found:

* ``coordinator.pub``: the base64 Ed25519 public key of the one coordinator whose signed specs
  this worker runs (``--coordinator-key FILE``; ``sandbench host trust-coordinator FILE``).
* ``worker.toml``: ``allowed_command_modes = ["gvisor", ...]``, the names of the command modes
  (a template run through ``/bin/sh`` as root) this worker runs; none when absent.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from contract.environ import setting
from contract.errors import HostKeyError
from contract.files import write_atomic
from contract.names import check_name
from contract.paths import HOME_ENV, sandbench_home
from contract.signing import fingerprint, public_key_from_b64

ETC_DIR = Path("/etc/sandbench")
WORKER_CONFIG = "worker.toml"
COORDINATOR_PUB = "coordinator.pub"
ALLOW_KEY = "allowed_command_modes"


def config_path(name: str) -> Path:
    """Where this worker reads ``name``: the first of ``$SANDBENCH_HOME``, ``/etc/sandbench``
    that has it, else where it should go (``$SANDBENCH_HOME`` when that is set)."""
    candidates = [sandbench_home() / name, ETC_DIR / name]
    found = next((p for p in candidates if p.exists()), None)
    if found is not None:
        return found
    return candidates[0] if setting(HOME_ENV) else ETC_DIR / name


def trusted_coordinator() -> tuple[str | None, str]:
    """The trusted coordinator public key (base64) or None, and the file it comes from."""
    path = config_path(COORDINATOR_PUB)
    if not path.exists():
        return None, f"no {path}"
    text = path.read_text().strip()
    try:
        public_key_from_b64(text)
    except HostKeyError:
        return None, f"{path} is not an Ed25519 public key"
    return text, f"{path}, fingerprint {fingerprint(text)}"


def trust_coordinator(public_b64: str, home: Path, *, replace: bool = False) -> Path:
    """Trust coordinator key ``public_b64`` (``home/coordinator.pub``); a change needs replace."""
    public_key_from_b64(public_b64)  # validates
    public_b64 = public_b64.strip()
    path = home / COORDINATOR_PUB
    if path.exists() and path.read_text().strip() != public_b64 and not replace:
        old = path.read_text().strip()
        raise HostKeyError(
            f"{path} already trusts another coordinator key: trusted fingerprint "
            f"{fingerprint(old)}, presented {fingerprint(public_b64)}. Refused: another "
            "machine may be posing as the coordinator. If the coordinator's key really changed, "
            "replace it on purpose: sandbench host trust-coordinator --replace FILE"
        )
    home.mkdir(parents=True, exist_ok=True)
    write_atomic(path, public_b64 + "\n", mode=0o644)
    return path


def allow_command_modes(names: list[str], home: Path, *, keep: bool = False) -> Path | None:
    """Write ``home/worker.toml`` allowing command modes ``names`` (each a valid name); with
    ``keep``, an existing file stays as it is when ``names`` is empty (None is returned)."""
    path = home / WORKER_CONFIG
    if keep and not names and path.exists():
        return None
    for name in names:
        check_name(name, "command mode")
    listed = ", ".join(f'"{n}"' for n in names)
    text = (
        "# Command modes this worker runs: each runs its template through /bin/sh as root.\n"
        "# A spec cannot allow one; add names here (or install.sh --allow-command-modes).\n"
        f"{ALLOW_KEY} = [{listed}]\n"
    )
    home.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, mode=0o644)
    return path


@dataclass(frozen=True)
class Allowlist:
    """The command modes this worker's configuration allows, and the file that says so."""

    path: Path
    modes: frozenset[str]
    problem: str | None = None  # the file exists but cannot be read as this configuration

    def refusal(self, mode: str) -> str | None:
        """Why command mode ``mode`` may not run here, naming the file and the line to add."""
        if self.problem:
            return f"command mode '{mode}' refused: {self.problem}"
        if mode in self.modes:
            return None
        names = ", ".join(f'"{m}"' for m in sorted({*self.modes, mode}))
        return (f"command mode '{mode}' is not allowed on this worker (a spec cannot allow "
                f"one): add the line {ALLOW_KEY} = [{names}] to {self.path}")  # fmt: skip


def load_allowlist() -> Allowlist:
    """This worker's allowlist of command modes, read now (an edit applies to new campaigns)."""
    path = config_path(WORKER_CONFIG)
    if not path.exists():
        return Allowlist(path, frozenset())
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return Allowlist(path, frozenset(), f"{path} is not valid TOML ({exc})")
    modes = data.get(ALLOW_KEY, [])
    if not isinstance(modes, list) or not all(isinstance(m, str) for m in modes):
        return Allowlist(path, frozenset(), f"{path}: {ALLOW_KEY} must be a list of mode names")
    return Allowlist(path, frozenset(modes))
