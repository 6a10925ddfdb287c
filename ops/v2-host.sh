#!/usr/bin/env bash
# Run a command on a cgroup v2 lab host booted here as a guest (testbed/v2host.py):
#   ops/v2-host.sh [--placement delegated|root] [--share DIR] [--timeout S] CMD [ARGS...]
# The repository is read-write at its own path; CMD's output and exit status are this script's.
# Needs the prepared guest (`sandbench vm prepare`, run by ops/setup.sh) and qemu-system-x86.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="$REPO/.venv/bin/python"
if [ ! -x "$PY" ]; then
  echo "ops/v2-host.sh: $PY is missing: run bash ops/setup.sh first" >&2
  exit 2
fi
exec "$PY" -m testbed.v2host "$@"
