#!/usr/bin/env bash
# Set up this machine and run the whole test suite. Services (redis-server, dockerd) are started
# by the tests themselves on private sockets and ports, and stopped after.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
bash ops/setup.sh
export CI="${CI:-}"
echo "==> ruff (lint and format)"
.venv/bin/ruff check coordinator worker contract workloads testbed tests benchmarks
.venv/bin/ruff format --check coordinator worker contract workloads testbed tests benchmarks
echo "==> mypy (strict, the five packages)"
.venv/bin/mypy
echo "==> pytest"
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
