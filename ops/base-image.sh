#!/usr/bin/env bash
# Make the fleet image's base without a container registry: a minimal Debian root filesystem
# built from Debian's package archive (mmdebstrap, else debootstrap), imported into the docker
# daemon that $DOCKER_HOST names.
#
#   ops/base-image.sh [--tag sandbench-base:bookworm] [--mirror URL] [--suite bookworm] [--force]
#
# The mirror defaults to the one this host's apt uses for the suite (/etc/apt/sources.list*).
# Local CA certificates of this host (/usr/local/share/ca-certificates) go into the image, so
# the build's apt and pip trust what this host trusts (a TLS-inspecting proxy, a private mirror).
# An existing image of that tag is kept unless --force. Then build with
#   SANDBENCH_BASE_IMAGE=sandbench-base:bookworm docker-compose up --build -d
set -euo pipefail
tag=sandbench-base:bookworm suite=bookworm mirror="${SANDBENCH_DEBIAN_MIRROR:-}" force=0
DOCKER="${DOCKER:-docker}"

usage() { sed -n '2,13p' "$0"; exit 2; }
while (($#)); do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --mirror) mirror="$2"; shift 2 ;;
    --suite) suite="$2"; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) usage ;;
    *) echo "base-image.sh: unknown option $1" >&2; usage ;;
  esac
done
say() { printf '==> %s\n' "$*" >&2; }

# The first URI of an apt source (one-line or deb822 format) that serves $suite.
apt_mirror() {
  python3 - "$suite" /etc/apt/sources.list /etc/apt/sources.list.d/* <<'EOF'
import sys
from pathlib import Path

suite, files = sys.argv[1], [Path(p) for p in sys.argv[2:]]
for path in files:
    if not path.is_file():
        continue
    text = path.read_text(errors="replace")
    if path.suffix == ".sources":
        for stanza in text.split("\n\n"):
            fields = dict(
                (k.strip().lower(), v.split())
                for k, _, v in (line.partition(":") for line in stanza.splitlines())
                if v and not k.startswith((" ", "#"))
            )
            if suite in fields.get("suites", []) and "deb" in fields.get("types", []):
                print(fields["uris"][0])
                sys.exit(0)
        continue
    for line in text.splitlines():
        words = [w for w in line.split("#", 1)[0].split() if not w.startswith("[")]
        if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
            print(words[1])
            sys.exit(0)
sys.exit(1)
EOF
}

if [ "$force" = 0 ] && "$DOCKER" image inspect "$tag" >/dev/null 2>&1; then
  say "base image $tag already present (--force makes it again)"
  exit 0
fi
if [ -z "$mirror" ]; then
  mirror="$(apt_mirror)" || {
    echo "base-image.sh: no apt source serves '$suite'; pass --mirror URL" >&2; exit 2; }
fi

# Like debian:*-slim: no documentation, manuals or translations (copyright files stay).
dpkg_opts=(--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
           --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*')
# shellcheck disable=SC2016  # $1 is the root filesystem, expanded by mmdebstrap's hook shell
ca_hook='if [ -d /usr/local/share/ca-certificates ]; then
  mkdir -p "$1/usr/local/share/ca-certificates"
  cp -a /usr/local/share/ca-certificates/. "$1/usr/local/share/ca-certificates/"; fi'

start=$(date +%s)
if command -v mmdebstrap >/dev/null; then
  say "mmdebstrap --variant=minbase $suite from $mirror -> $tag"
  mmdebstrap --quiet --variant=minbase --format=tar "${dpkg_opts[@]}" \
      --customize-hook="$ca_hook" "$suite" - "$mirror" \
    | "$DOCKER" import --change 'CMD ["bash"]' - "$tag" >/dev/null
elif command -v debootstrap >/dev/null; then
  say "debootstrap --variant=minbase $suite from $mirror -> $tag"
  rootfs="$(mktemp -d /var/tmp/sandbench-rootfs.XXXXXX)"
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >/dev/null
  sh -c "$ca_hook" sh "$rootfs"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | "$DOCKER" import --change 'CMD ["bash"]' - "$tag" >/dev/null
else
  echo "base-image.sh: needs mmdebstrap or debootstrap (apt-get install mmdebstrap)" >&2
  exit 1
fi
size="$("$DOCKER" image inspect --format '{{.Size}}' "$tag")"
say "base image $tag: $((size / 1048576)) MiB in $(($(date +%s) - start)) s"
