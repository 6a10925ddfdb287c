#!/usr/bin/env bash
# Provision a lab host (Debian/Ubuntu or Fedora, as root) for the sandbench fleet.
#
#   ops/install.sh --role broker --bind 10.0.0.5      # redis: generated password, append-only
#   ops/install.sh --role coordinator --broker redis://broker:6379/0 --password-file pw
#   ops/install.sh --role worker --host lab-a --broker redis://broker:6379/0 --password-file pw \
#       --coordinator-key coordinator.pub [--allow-command-modes gvisor,nsjail]
#
# Offline (no internet on the lab host): --wheels DIR installs sandbench and its dependencies from
# a wheelhouse built on a connected machine of the same distribution and Python, with
#   python3 -m pip wheel --wheel-dir wheels /path/to/sandbench &&
#   git -C /path/to/sandbench rev-parse HEAD > wheels/sandbench-commit
# (the commit the provenance names) and takes the system packages as they are: a missing one
# is named (and nothing installed) instead of failing inside apt. Online, only the missing
# packages are installed.
#
# The coordinator role creates the coordinator's Ed25519 key and exports its public half to
# /etc/sandbench/coordinator.pub: copy that file to each worker for --coordinator-key. A worker
# runs only specs signed by that key, and command modes (templates run as root) only if named
# in --allow-command-modes (kept in /etc/sandbench/worker.toml: allowed_command_modes = [...]).
#
# TLS: --tls-cert FILE --tls-key FILE on the broker; a rediss:// URL and --broker-ca FILE (the CA
# that signed the broker's certificate) on the others. --port PORT (default 6379) on the broker;
# --root DIR writes every file under DIR and touches no package, venv, key or service (tests; it
# uses the repository's own .venv for the checks).
#
# The broker's password is never on a command line: the broker writes it to an include file of
# redis.conf (mode 0600, owner redis) and to /etc/sandbench/broker.password (0600), which you copy
# to the other hosts for --password-file (without it, the script asks). Workers and the
# coordinator keep the whole URL in /etc/sandbench/sandbench.env (0600), read by the systemd units
# and by /usr/local/bin/sandbench, the command with this host's configuration.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
role="" host="$(hostname -s)" broker="" password_file="" broker_ca="" port=6379 root=""
tls_cert="" tls_key="" binds=() coordinator_key="" allow_modes="" wheels=""

usage() { sed -n '2,29p' "$0"; exit 2; }
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
    --wheels) wheels="$(realpath -m "$2")"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "install.sh: unknown option $1" >&2; usage ;;
  esac
done
[[ "$role" =~ ^(worker|coordinator|broker)$ ]] || usage
[[ "$port" =~ ^[0-9]{1,5}$ ]] || die "--port $port is not a port number"
[ -z "$wheels" ] || [ -d "$wheels" ] || die "--wheels $wheels is not a directory (a wheelhouse:" \
  "python3 -m pip wheel --wheel-dir DIR /path/to/sandbench, on a connected machine)"
[ -z "$password_file" ] || [ -r "$password_file" ] || die "--password-file $password_file cannot" \
  "be read (the broker's /etc/sandbench/broker.password, copied here)"
PREFIX="$root/opt/sandbench"
HOME_DIR="$root/var/lib/sandbench"
ETC="$root/etc/sandbench"
ENV_FILE="$ETC/sandbench.env"
WRAPPER="$root/usr/local/bin/sandbench"
# The sandbench command this script asks what Python already knows (names, keys, trust).
if [ -n "$root" ]; then SANDBENCH="$REPO/.venv/bin/sandbench"; else SANDBENCH="$PREFIX/venv/bin/sandbench"; fi
sb() { SANDBENCH_HOME="$HOME_DIR" "$SANDBENCH" "$@"; }

# --- system packages: checked, installed only when missing and online ------------------------
packages_for() {  # the packages role $1 needs, for package manager $2 (apt or dnf)
  local python=(python3) worker=(git gcc make bubblewrap util-linux iproute2 e2fsprogs)
  [ "$2" = apt ] && python+=(python3-venv)
  case "$1" in
    broker) if [ "$2" = apt ]; then echo redis-server openssl; else echo redis openssl; fi ;;
    coordinator) echo "${python[*]} openssl" ;;
    worker) echo "${python[*]} ${worker[*]}" ;;
  esac
}

ensure_packages() {
  local manager missing=() p
  if command -v dpkg-query >/dev/null; then manager=apt
  elif command -v rpm >/dev/null; then manager=dnf
  else die "neither dpkg nor rpm found: install $(packages_for "$role" apt) by hand"; fi
  for p in $(packages_for "$role" "$manager"); do
    if [ "$manager" = apt ]; then
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    else
      rpm -q "$p" >/dev/null 2>&1 || missing+=("$p")
    fi
  done
  ((${#missing[@]})) || { say "system packages: all there"; return; }
  if [ -n "$wheels" ]; then
    die "missing system packages: ${missing[*]}. Offline (--wheels), nothing is fetched:" \
      "install them from your distribution's media or local mirror, then run this again"
  fi
  say "installing ${missing[*]}"
  if [ "$manager" = apt ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    dnf install -y -q "${missing[@]}"
  fi
}

install_venv() {
  say "venv in $PREFIX/venv"
  mkdir -p "$PREFIX" "$HOME_DIR"
  [ -x "$PREFIX/venv/bin/python" ] || python3 -m venv "$PREFIX/venv"
  # --no-compile: bytecode is written on first import, not for every module of every dependency
  # (minutes on a slow host, for modules the worker never imports).
  local pip=("$PREFIX/venv/bin/pip" install -q --disable-pip-version-check --no-compile)
  # Then sandbench itself again: a rebuilt release keeps its version number, which pip alone
  # would take as installed already.
  if [ -n "$wheels" ]; then
    "${pip[@]}" --no-index --find-links "$wheels" sandbench || die "pip found no complete" \
      "sandbench in $wheels: build the wheelhouse again from this release (see --help)"
    "${pip[@]}" --no-index --find-links "$wheels" --no-deps --force-reinstall sandbench
  else
    "${pip[@]}" "$REPO"
    "${pip[@]}" --no-deps --force-reinstall "$REPO"
  fi
}

# The commit the provenance names: a venv has no git tree, so the commit installed is recorded in
# it: the wheelhouse's (its sandbench-commit, written when it was built), else this repository's.
record_commit() {
  local commit from=()
  [ -z "$wheels" ] || from=(--wheels "$wheels")
  commit="$(sb host harness-commit --repo "$REPO" "${from[@]}" --record)" || commit=unknown
  say "harness commit: $commit"
}

# /usr/local/bin/sandbench: the command with this host's broker URL, home and store.
install_wrapper() {
  mkdir -p "$(dirname "$WRAPPER")"
  cat > "$WRAPPER" <<EOF
#!/bin/sh
# sandbench with this host's configuration (written by ops/install.sh --role $role).
set -a; . $ENV_FILE; set +a
exec $PREFIX/venv/bin/sandbench "\$@"
EOF
  chmod 0755 "$WRAPPER"
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

check_broker_url() {
  [ -n "$broker" ] || die "--broker URL is required for $role"
  [[ "$broker" =~ ^rediss?://[^/@]+(:[0-9]+)?(/[0-9]*)?(\?.*)?$ ]] || die \
    "--broker $broker is not redis://HOST[:PORT]/DB or rediss://...; the password goes in" \
    "--password-file, never on the command line"
}

# The configuration is written beside the one in use ($ENV_FILE.new) and takes its place only
# once the broker accepted it (commit_env): a re-run with a wrong --password-file leaves a
# working host's configuration as it was.
write_env() {
  mkdir -p "$ETC" "$HOME_DIR"
  local url; url="$(broker_url)"
  (
    umask 077
    {
      echo "SANDBENCH_BROKER=$url"
      echo "SANDBENCH_HOME=$HOME_DIR"
      if [ "$role" = coordinator ]; then
        echo "SANDBENCH_DATA=$HOME_DIR/data"
        echo "SANDBENCH_FLOWER_AUTH=admin:$(openssl rand -hex 12)"
      fi
    } > "$ENV_FILE.new"
  )
  chmod 0600 "$ENV_FILE.new"
}

commit_env() {
  mv -f "$ENV_FILE.new" "$ENV_FILE"
  say "wrote $ENV_FILE (mode 0600: the broker URL with its password)"
}

# The broker answers with this host's URL and password (the configuration just written), before
# anything is installed where a harness is installed already, else before any unit starts: a
# wrong --password-file or an unreachable broker is one line now, not a unit restarting every
# few seconds, and the configuration in use is kept.
check_broker_answers() {
  (set -a; . "$ENV_FILE.new"; set +a; sb host check-broker) || {
    rm -f "$ENV_FILE.new"
    die "the broker did not accept this host (the line above says why; $ENV_FILE is" \
      "unchanged): --password-file must hold the broker's $ETC/broker.password, and the broker" \
      "must be installed with --bind an address this host reaches; then run this command again"
  }
}

# A re-run (a harness is installed): the broker is asked first, before minutes of installing.
check_broker_early() {
  checked=""
  if [ -z "$root" ] && [ -x "$SANDBENCH" ]; then check_broker_answers; checked=1; fi
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

# The one coordinator key this worker obeys (sandbench host trust-coordinator: it refuses a
# malformed key, and another key where one is trusted).
require_coordinator_key() {
  [ -n "$coordinator_key" ] || [ -s "$ETC/coordinator.pub" ] || die "--coordinator-key FILE is" \
    "required for a worker: the coordinator's public key (on the coordinator:" \
    "/etc/sandbench/coordinator.pub, or sandbench coordinator init --export DIR)"
  [ -z "$coordinator_key" ] || [ -r "$coordinator_key" ] ||
    die "--coordinator-key $coordinator_key cannot be read"
}

setup_worker() {
  check_broker_url; require_coordinator_key
  write_env; check_broker_early
  [ -n "$root" ] || { ensure_packages; install_venv; record_commit; }
  # What Python knows, asked before anything is configured: the key, the names.
  if [ -n "$coordinator_key" ]; then
    sb host trust-coordinator "$coordinator_key" --home "$ETC" >/dev/null || die "the worker" \
      "was not set up (the line above says why)"
  fi
  say "worker runs only specs signed by the coordinator key in $ETC/coordinator.pub"
  if [ -z "$root" ]; then
    sb host init --name "$host" || die "no host key made (the line above says why)"
  fi
  sb host allow-command-modes "$allow_modes" --home "$ETC" --keep ||
    die "the worker was not set up (the line above says why)"
  install_units; install_wrapper
  [ -n "$checked" ] || [ -n "$root" ] || check_broker_answers
  commit_env
  [ -n "$root" ] && return
  # restart, not only start: an install over an older one runs the new code (a running environment
  # finishes first: the warm shutdown)
  systemctl enable "sandbench-worker@$host" && systemctl restart "sandbench-worker@$host"
  say "worker sandbench-worker@$host started: journalctl -u sandbench-worker@$host"
}

setup_coordinator() {
  check_broker_url
  write_env; check_broker_early
  [ -n "$root" ] || { ensure_packages; install_venv; record_commit; }
  install_units; install_wrapper
  [ -n "$checked" ] || [ -n "$root" ] || check_broker_answers
  commit_env
  [ -n "$root" ] && return
  # The coordinator's key: signs the expansion, every spec, the logs.
  sb coordinator init --export "$ETC"
  systemctl enable sandbench-coordinator sandbench-flower
  systemctl restart sandbench-coordinator sandbench-flower
  say "Flower credentials are in $ENV_FILE (SANDBENCH_FLOWER_AUTH)"
}

case "$role" in
  broker) [ -n "$root" ] || ensure_packages; setup_broker ;;
  worker) setup_worker ;;
  coordinator) setup_coordinator ;;
esac
say "done"
