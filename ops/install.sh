#!/usr/bin/env bash
# Provision a lab host (Debian/Ubuntu or Fedora, as root) for the sandbench fleet.
#
#   ops/install.sh --role worker --host lab-a --broker 'redis://:PASSWORD@broker:6379/0'
#   ops/install.sh --role coordinator --broker 'redis://:PASSWORD@127.0.0.1:6379/0'
#   ops/install.sh --role broker            # redis-server with a generated password, AOF on
#
# Installs packages, a venv in /opt/sandbench, the environment file /etc/sandbench/sandbench.env
# (mode 0600: credentials live there, never in code), the systemd units, and for a worker its
# host key in /var/lib/sandbench with the registration command to run on the coordinator.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PREFIX=/opt/sandbench
HOME_DIR=/var/lib/sandbench
ENV_FILE=/etc/sandbench/sandbench.env
role="" host="$(hostname -s)" broker=""

usage() { sed -n '2,12p' "$0"; exit 2; }
while (($#)); do
  case "$1" in
    --role) role="$2"; shift 2 ;;
    --host) host="$2"; shift 2 ;;
    --broker) broker="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "install.sh: unknown option $1" >&2; usage ;;
  esac
done
[[ "$role" =~ ^(worker|coordinator|broker)$ ]] || usage
say() { printf '==> %s\n' "$*"; }

install_packages() {
  local common=(python3 git gcc make bubblewrap util-linux iproute2 e2fsprogs openssl)
  if command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    [ "$role" = broker ] && common+=(redis-server)
    apt-get install -y -q --no-install-recommends python3-venv "${common[@]}"
  elif command -v dnf >/dev/null; then
    [ "$role" = broker ] && common+=(redis)
    dnf install -y -q "${common[@]}" glibc-devel
  else
    echo "install.sh: neither apt-get nor dnf found; install ${common[*]} by hand" >&2; exit 1
  fi
}

install_venv() {
  say "venv in $PREFIX/venv"
  mkdir -p "$PREFIX" "$HOME_DIR" /etc/sandbench
  [ -x "$PREFIX/venv/bin/python" ] || python3 -m venv "$PREFIX/venv"
  "$PREFIX/venv/bin/pip" install -q --disable-pip-version-check "$REPO"
}

write_env() {
  [ -n "$broker" ] || { echo "install.sh: --broker URL is required for $role" >&2; exit 2; }
  umask 077
  {
    echo "SANDBENCH_BROKER=$broker"
    echo "SANDBENCH_HOME=$HOME_DIR"
    [ "$role" = coordinator ] && echo "SANDBENCH_FLOWER_AUTH=admin:$(openssl rand -hex 12)"
  } > "$ENV_FILE"
  say "wrote $ENV_FILE (mode 0600)"
}

install_units() {
  install -m 0644 "$REPO"/ops/systemd/sandbench-*.service /etc/systemd/system/
  systemctl daemon-reload
}

setup_broker() {
  local conf=/etc/redis/redis.conf auth=/etc/redis/sandbench-auth.conf
  [ -f "$conf" ] || conf=/etc/redis.conf
  install -m 0644 "$REPO/ops/redis.conf" /etc/redis/sandbench.conf
  if [ ! -f "$auth" ]; then
    (umask 027; echo "requirepass $(openssl rand -hex 24)" > "$auth")
    chgrp redis "$auth" 2>/dev/null || true
  fi
  for inc in /etc/redis/sandbench.conf "$auth"; do
    grep -qx "include $inc" "$conf" || echo "include $inc" >> "$conf"
  done
  local unit=redis-server; systemctl list-unit-files redis.service >/dev/null 2>&1 && unit=redis
  systemctl enable --now "$unit" && systemctl restart "$unit"
  say "redis password is in $auth; broker URL: redis://:PASSWORD@$(hostname -f):6379/0"
  say "open port 6379 to the lab hosts only (bind in /etc/redis/sandbench.conf)"
}

install_packages
case "$role" in
  broker) setup_broker ;;
  worker)
    install_venv; write_env; install_units
    SANDBENCH_HOME=$HOME_DIR "$PREFIX/venv/bin/python" - "$host" <<'PY'
import sys
from tasks.signing import HostKey, default_key_path
key = HostKey.load_or_create(default_key_path(), name=sys.argv[1])
print(f"==> host key {key.key_id}; on the coordinator run:")
print(f"    sandbench hosts add {key.name} {key.public_b64()}")
PY
    systemctl enable --now "sandbench-worker@$host" ;;
  coordinator)
    install_venv; write_env; install_units
    systemctl enable --now sandbench-coordinator sandbench-flower
    say "Flower credentials are in $ENV_FILE (SANDBENCH_FLOWER_AUTH)" ;;
esac
say "done"
