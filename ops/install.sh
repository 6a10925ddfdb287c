#!/usr/bin/env bash
# Provision a lab host (Debian/Ubuntu or Fedora, as root) for the sandbench fleet.
#
#   ops/install.sh --role broker --bind 10.0.0.5      # redis: generated password, append-only
#   ops/install.sh --role coordinator --broker redis://broker:6379/0 --password-file pw
#   ops/install.sh --role worker --host lab-a --broker redis://broker:6379/0 --password-file pw \
#       --coordinator-key coordinator.pub [--allow-command-modes gvisor,nsjail]
#
# The coordinator role creates the coordinator's Ed25519 key and exports its public half to
# /etc/sandbench/coordinator.pub: copy that file to each worker for --coordinator-key. A worker
# runs only specs signed by that key, and command modes (templates run as root) only if named
# in --allow-command-modes (kept in /etc/sandbench/worker.toml: allowed_command_modes = [...]).
#
# TLS: --tls-cert FILE --tls-key FILE on the broker; a rediss:// URL and --broker-ca FILE (the CA
# that signed the broker's certificate) on the others. --port PORT (default 6379) on the broker;
# --root DIR writes every file under DIR and touches no package, venv, key or service (tests).
#
# The broker's password is never on a command line: the broker writes it to an include file of
# redis.conf (mode 0600, owner redis) and to /etc/sandbench/broker.password (0600), which you copy
# to the other hosts for --password-file (without it, the script asks). Workers and the
# coordinator keep the whole URL in /etc/sandbench/sandbench.env (0600), read by the systemd units.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
NAME_RE='^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'  # tasks/names.py: a host name is a file name
role="" host="$(hostname -s)" broker="" password_file="" broker_ca="" port=6379 root=""
tls_cert="" tls_key="" binds=() coordinator_key="" allow_modes=""

usage() { sed -n '2,22p' "$0"; exit 2; }
die() { echo "install.sh: $*" >&2; exit 2; }
say() { printf '==> %s\n' "$*"; }
while (($#)); do
  case "$1" in
    --role) role="$2"; shift 2 ;;
    --host) host="$2"; shift 2 ;;
    --broker) broker="$2"; shift 2 ;;
    --password-file) password_file="$2"; shift 2 ;;
    --broker-ca) broker_ca="$2"; shift 2 ;;
    --bind) read -ra more <<<"$2"; binds+=("${more[@]}"); shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --tls-cert) tls_cert="$2"; shift 2 ;;
    --tls-key) tls_key="$2"; shift 2 ;;
    --root) root="$(realpath -m "$2")"; shift 2 ;;
    --coordinator-key) coordinator_key="$2"; shift 2 ;;
    --allow-command-modes) allow_modes="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "install.sh: unknown option $1" >&2; usage ;;
  esac
done
[[ "$role" =~ ^(worker|coordinator|broker)$ ]] || usage
[[ "$port" =~ ^[0-9]{1,5}$ ]] || die "--port $port is not a port number"
PREFIX="$root/opt/sandbench"
HOME_DIR="$root/var/lib/sandbench"
ETC="$root/etc/sandbench"
ENV_FILE="$ETC/sandbench.env"

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
  mkdir -p "$PREFIX" "$HOME_DIR"
  [ -x "$PREFIX/venv/bin/python" ] || python3 -m venv "$PREFIX/venv"
  "$PREFIX/venv/bin/pip" install -q --disable-pip-version-check "$REPO"
}

# The broker's password: first line of --password-file, else asked for (never an argument).
read_password() {
  if [ -n "$password_file" ]; then
    head -n 1 "$password_file" | tr -d '\r\n'
  elif [ -t 0 ]; then
    local pw; read -rsp "broker password (empty: none): " pw; echo >&2; printf '%s' "$pw"
  fi
}

# The broker URL with the password (URL-encoded, passed on stdin) and the CA file added.
broker_url() {
  local url="$broker" password encoded
  if [ -n "$broker_ca" ]; then
    [[ "$url" == rediss://* ]] || die "--broker-ca needs a rediss:// (TLS) URL"
    install -m 0644 "$broker_ca" "$ETC/broker-ca.pem"
    [[ "$url" == *\?* ]] && url+="&" || url+="?"
    url+="ssl_ca_certs=$ETC/broker-ca.pem"
  fi
  password="$(read_password)"
  if [ -n "$password" ]; then
    encoded="$(printf '%s' "$password" |
      python3 -c 'import sys, urllib.parse as u; print(u.quote(sys.stdin.read(), safe=""))')"
    url="${url%%://*}://:$encoded@${url#*://}"
  fi
  printf '%s' "$url"
}

write_env() {
  [ -n "$broker" ] || die "--broker URL is required for $role"
  [[ "$broker" =~ ^rediss?://[^/@]+(:[0-9]+)?(/[0-9]*)?(\?.*)?$ ]] || die \
    "--broker $broker is not redis://HOST[:PORT]/DB or rediss://...; the password goes in" \
    "--password-file, never on the command line"
  mkdir -p "$ETC" "$HOME_DIR"
  local url; url="$(broker_url)"
  (
    umask 077
    {
      echo "SANDBENCH_BROKER=$url"
      echo "SANDBENCH_HOME=$HOME_DIR"
      if [ "$role" = coordinator ]; then
        echo "SANDBENCH_FLOWER_AUTH=admin:$(openssl rand -hex 12)"
      fi
    } > "$ENV_FILE"
  )
  chmod 0600 "$ENV_FILE"
  say "wrote $ENV_FILE (mode 0600: the broker URL with its password)"
}

install_units() {
  mkdir -p "$root/etc/systemd/system"
  install -m 0644 "$REPO"/ops/systemd/sandbench-*.service "$root/etc/systemd/system/"
  [ -n "$root" ] || systemctl daemon-reload
}

# A file redis-server reads: owned by its user when there is one (not under --root).
redis_owns() { [ -z "$root" ] && id redis >/dev/null 2>&1 && chown redis:redis "$@"; true; }

# Where redis listens: the --bind addresses, else loopback only (remote workers need --bind).
check_binds() {
  local addr
  if ((${#binds[@]} == 0)); then
    binds=(127.0.0.1 -::1)
    say "bound to loopback only; give --bind ADDR for workers on other machines"
  fi
  for addr in "${binds[@]}"; do
    [[ "$addr" =~ ^-?[0-9A-Za-z.:%*]+$ ]] || die "--bind $addr is not an address"
  done
}

setup_broker() {
  local dir="$root/etc/redis" conf ours auth tls
  conf="$dir/redis.conf"; ours="$dir/sandbench.conf"; auth="$dir/sandbench-auth.conf"
  tls="$dir/sandbench-tls.conf"
  mkdir -p "$dir" "$ETC"
  [ -f "$conf" ] || [ ! -f "$root/etc/redis.conf" ] || conf="$root/etc/redis.conf"  # Fedora
  check_binds
  sed -e "s/^bind .*/bind ${binds[*]}/" -e "s/^port .*/port $port/" "$REPO/ops/redis.conf" > "$ours"
  chmod 0644 "$ours"
  if [ ! -s "$auth" ]; then (umask 077; echo "requirepass $(openssl rand -hex 24)" > "$auth"); fi
  chmod 0600 "$auth"; redis_owns "$auth"
  (umask 077; sed -n 's/^requirepass //p' "$auth" > "$ETC/broker.password")
  local includes=("$ours" "$auth") scheme=redis
  if [ -n "$tls_cert$tls_key" ]; then
    [ -f "$tls_cert" ] && [ -f "$tls_key" ] || die "--tls-cert and --tls-key name two files"
    install -m 0644 "$tls_cert" "$dir/sandbench-tls.crt"
    install -m 0600 "$tls_key" "$dir/sandbench-tls.key"; redis_owns "$dir/sandbench-tls.key"
    printf 'port 0\ntls-port %s\ntls-cert-file %s\ntls-key-file %s\ntls-auth-clients no\n' \
      "$port" "$dir/sandbench-tls.crt" "$dir/sandbench-tls.key" > "$tls"
    includes+=("$tls"); scheme=rediss
  fi
  touch "$conf"
  for inc in "${includes[@]}"; do
    grep -qxF "include $inc" "$conf" || echo "include $inc" >> "$conf"
  done
  if [ -z "$root" ]; then
    local unit=redis-server; systemctl list-unit-files redis.service >/dev/null 2>&1 && unit=redis
    systemctl enable --now "$unit" && systemctl restart "$unit"
  fi
  say "broker on ${binds[*]}, port $port; URL $scheme://$(hostname -f):$port/0 (the others' --broker)"
  say "password in $ETC/broker.password (0600): copy it to each host for --password-file"
}

# The one coordinator key this worker obeys: --coordinator-key FILE into $ETC/coordinator.pub;
# another key where one is installed is refused (remove the file to change it on purpose).
trust_coordinator() {
  local target="$ETC/coordinator.pub" key
  if [ -z "$coordinator_key" ]; then
    [ -s "$target" ] || die "--coordinator-key FILE is required for a worker: the coordinator's" \
      "public key (on the coordinator: /etc/sandbench/coordinator.pub, or sandbench coordinator" \
      "init --export DIR)"
    return
  fi
  key="$(tr -d ' \r\n' < "$coordinator_key")"
  python3 -c 'import base64, sys; sys.exit(len(base64.b64decode(sys.argv[1], validate=True)) != 32)' \
    "$key" 2>/dev/null || die "--coordinator-key $coordinator_key is not an Ed25519 public key"
  if [ -s "$target" ] && [ "$(tr -d ' \r\n' < "$target")" != "$key" ]; then
    die "$target already trusts another coordinator key; refused (another machine may pose as" \
      "the coordinator). If the coordinator's key really changed, remove $target and run again"
  fi
  mkdir -p "$ETC"; printf '%s\n' "$key" > "$target"; chmod 0644 "$target"
  say "worker runs only specs signed by the coordinator key in $target"
}

# The command modes this worker runs (a spec can never allow one): $ETC/worker.toml.
write_allowlist() {
  local target="$ETC/worker.toml" names=() name
  [ -n "$allow_modes" ] || [ ! -e "$target" ] || return 0
  IFS=',' read -ra names <<<"$allow_modes"
  local quoted=()
  for name in "${names[@]}"; do
    [[ "$name" =~ $NAME_RE ]] || die "--allow-command-modes: '$name' is not a mode name"
    quoted+=("\"$name\"")
  done
  mkdir -p "$ETC"
  {
    echo "# Command modes this worker runs: each runs its template through /bin/sh as root."
    echo "# A spec cannot allow one; add names here (or install.sh --allow-command-modes)."
    echo "allowed_command_modes = [$(IFS=,; echo "${quoted[*]}" | sed 's/,/, /g')]"
  } > "$target"
  chmod 0644 "$target"
  say "command modes allowed on this worker: ${allow_modes:-none} ($target)"
}

setup_worker() {
  [[ "$host" =~ $NAME_RE ]] || die "--host $host: use 1-64 letters, digits, '.', '_' or '-'"
  trust_coordinator
  [ -n "$root" ] || { install_packages; install_venv; }
  write_env; write_allowlist; install_units
  if [ -n "$root" ]; then return; fi
  SANDBENCH_HOME=$HOME_DIR "$PREFIX/venv/bin/python" - "$host" <<'PY'
import sys
from tasks.signing import HostKey, default_key_path
key = HostKey.load_or_create(default_key_path(), name=sys.argv[1])
print(f"==> host key {key.key_id}; on the coordinator run:")
print(f"    sandbench hosts add {key.name} {key.public_b64()}")
PY
  systemctl enable --now "sandbench-worker@$host"
}

setup_coordinator() {
  [ -n "$root" ] || { install_packages; install_venv; }
  write_env; install_units
  if [ -z "$root" ]; then  # the coordinator's key: signs the expansion, every spec, the logs
    SANDBENCH_HOME=$HOME_DIR "$PREFIX/venv/bin/sandbench" coordinator init --export "$ETC"
  fi
  [ -n "$root" ] || systemctl enable --now sandbench-coordinator sandbench-flower
  say "Flower credentials are in $ENV_FILE (SANDBENCH_FLOWER_AUTH)"
}

case "$role" in
  broker) [ -n "$root" ] || install_packages; setup_broker ;;
  worker) setup_worker ;;
  coordinator) setup_coordinator ;;
esac
say "done"
