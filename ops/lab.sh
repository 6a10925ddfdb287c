#!/usr/bin/env bash
# A lab of systemd hosts booted on this machine (testbed/lab.py), to try the fleet on one machine:
#   ops/lab.sh up 3 [--clock-offset lab-b=3600]   # lab-a, lab-b, lab-c on 10.77.0.11-13
#   ops/lab.sh ssh lab-a [CMD...]                  # root on a host (inside the lab's netns)
#   ops/lab.sh kill lab-b; ops/lab.sh start lab-b  # a power cut, and the boot after it
#   ops/lab.sh wheels                              # the offline wheelhouse, at /media/lab/wheels
#   ops/lab.sh provision                           # install.sh offline: lab-c broker+coordinator
#   ops/lab.sh status; ops/lab.sh down             # every host stopped, everything removed
# --dir DIR (before the command) keeps the lab elsewhere than /var/lib/sandbench-lab.
# SANDBENCH_LAB_DEBUG=1 on up/start copies the guest's journal to its console.log (a stuck boot).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="$REPO/.venv/bin/python"
if [ ! -x "$PY" ]; then
  echo "ops/lab.sh: $PY is missing: run bash ops/setup.sh first" >&2
  exit 2
fi
cd "$REPO"
exec "$PY" -m testbed.cli "$@"
