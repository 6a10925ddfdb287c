#!/bin/busybox sh
# sandbench guest init: load modules, mount the host root read-only over 9p as the new root,
# mount the workspace, run the payload on the "sandbench" virtio-serial port, and report its
# exit status to QEMU through isa-debug-exit (QEMU then exits with 2*(status+1)+1).
# The job file (path in sandbench.job= on the kernel command line) is written by the host mode.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

say() { echo "sandbench-init: $*" >/dev/console; }

report() {
  # Guest status s -> isa-debug-exit value s+1 (1..62, so QEMU exits 3..125 and never 127,
  # the shell's "not found"); the host wrapper maps it back. Statuses above 61 become 61.
  s=$1; [ "$s" -gt 61 ] && s=61
  v=$((s + 1))
  printf "\\$(printf %o "$v")" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
  sleep 1
  poweroff -f
}

fail() { say "FAILED: $*"; report 61; }

port_named() {
  for p in /sys/class/virtio-ports/*; do
    [ "$(cat "$p/name" 2>/dev/null)" = "$1" ] && echo "/dev/${p##*/}" && return 0
  done
  return 1
}

for m in $(cat /modules.order); do
  if [ -n "$m" ]; then
    insmod "/lib/modules/$m.ko" || fail "insmod $m"
  fi
done
# Progress lines on the console: when a guest hangs, the runner's failure detail shows its tail.
say "modules loaded"

JOB=
for arg in $(cat /proc/cmdline); do
  case "$arg" in sandbench.job=*) JOB="${arg#sandbench.job=}" ;; esac
done
[ -n "$JOB" ] || fail "no sandbench.job= on the kernel command line"

OPTS9P="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o "$OPTS9P,ro,cache=loose" hostroot /newroot || fail "mount hostroot"
[ -r "/newroot$JOB" ] || fail "job file $JOB not visible in the guest"
say "host root mounted"
# Sets WS_PATH, WS_KIND (9p-mmap | 9p-loose | virtiofs | ext4 | none), PAYLOAD (a shell command
# line), PAYLOAD_DIR (the payload's directory on the host) and GUEST_PAYLOAD_DIR (where the
# command finds it), HOLD (1 = never start the payload) and PROBE (1 = only announce readiness).
. "/newroot$JOB"

mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mount -t tmpfs run /newroot/run
# The payload's directory (the bootstrap and its body), read-only at a fixed guest path,
# bound before the guest's own /tmp hides one that lives under the host's /tmp (a checkout).
if [ -n "$PAYLOAD_DIR" ]; then
  mkdir -p "/newroot$GUEST_PAYLOAD_DIR"
  mount -o bind,ro "/newroot$PAYLOAD_DIR" "/newroot$GUEST_PAYLOAD_DIR" || fail "bind $PAYLOAD_DIR"
fi
mount -t tmpfs -o mode=1777 tmp /newroot/tmp
if [ "$WS_KIND" != none ]; then
  mkdir -p "/newroot$WS_PATH" 2>/dev/null
  case "$WS_KIND" in
    9p-mmap) mount -t 9p -o "$OPTS9P,cache=mmap" ws "/newroot$WS_PATH" ;;
    9p-loose) mount -t 9p -o "$OPTS9P,cache=loose" ws "/newroot$WS_PATH" ;;
    virtiofs) mount -t virtiofs ws "/newroot$WS_PATH" ;;
    ext4) mount -t ext4 -o noinit_itable /dev/vda "/newroot$WS_PATH" ;;
    *) false ;;
  esac || fail "mount workspace ($WS_KIND) at $WS_PATH"
  say "workspace mounted ($WS_KIND)"
fi

PORT=$(port_named sandbench) || fail "no virtio-serial port named sandbench"
if CTL=$(port_named sandbench-ctl); then
  # The host's round sync: one line in, sync(2) of every guest filesystem, one line out.
  (exec 3<>"$CTL"; while read -r cmd <&3; do sync; echo "synced $cmd" >&3; done) &
fi

if [ "$PROBE" = 1 ]; then
  echo '{"op": "ready"}' >"$PORT"
  report 0
fi
if [ "$HOLD" = 1 ]; then
  say "holding: the payload is not started"
  while true; do sleep 3600; done
fi

cd /newroot
say "starting the payload"
eval "chroot /newroot /usr/bin/env -i $PAYLOAD" 0<>"$PORT" 1>&0
status=$?
say "payload exited with status $status"
sync
[ "$WS_KIND" = ext4 ] && umount "/newroot$WS_PATH"
report "$status"
