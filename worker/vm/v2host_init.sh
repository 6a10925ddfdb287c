#!/bin/busybox sh
# The cgroup v2 lab host's init (testbed/v2host.py): a pure cgroup v2 machine made from the
# prepared guest kernel. The host root is the read-only root over 9p; the scratch disk (ext4)
# holds /tmp, /var/tmp and /var/lib/sandbench; the shared directories (the repository first)
# are mounted read-write at their host paths; cgroup2 is /sys/fs/cgroup with cpu, cpuset,
# memory, pids and io enabled at the root. The command runs in a cgroup delegated the way
# systemd's Delegate=yes does it (or in the root cgroup: PLACEMENT=root), with the new root as
# the mount namespace's root (not a chroot: user namespaces work), its stdout and
# stderr on two virtio-serial ports; its exit status goes out on a third, then the guest
# powers off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

say() { echo "sandbench-v2host: $*" >/dev/console; }

port_named() {
  for p in /sys/class/virtio-ports/*; do
    [ "$(cat "$p/name" 2>/dev/null)" = "$1" ] && echo "/dev/${p##*/}" && return 0
  done
  return 1
}

finish() {
  # $1: the command's exit status, or "init-failed: why" when the host was never ready.
  sync
  say "exit status $1"
  if STATUS=$(port_named sandbench-status); then echo "$1" >"$STATUS"; fi
  sleep 0.2
  poweroff -f
}

fail() { say "FAILED: $*"; finish "init-failed: $*"; }

for m in $(cat /modules.order); do
  [ -n "$m" ] && { insmod "/lib/modules/$m.ko" || fail "insmod $m"; }
done

JOB=
for arg in $(cat /proc/cmdline); do
  case "$arg" in sandbench.job=*) JOB="${arg#sandbench.job=}" ;; esac
done
[ -n "$JOB" ] || fail "no sandbench.job= on the kernel command line"

OPTS9P="trans=virtio,version=9p2000.L,msize=512000"
R=/newroot
mount -t 9p -o "$OPTS9P,ro,cache=loose" hostroot $R || fail "mount the host root"
[ -r "$R$JOB" ] || fail "job file $JOB not visible in the guest"
# Sets CWD, ARGV (shell words), GUEST_ENV (NAME=value words), SHARES (host paths, mount tags
# share0, share1, ...), PLACEMENT (delegated | root), SERVICE (the delegated cgroup), NAME.
. "$R$JOB"

mkdir -p /scratch
mount -t ext4 -o noinit_itable /dev/vda /scratch || fail "mount the scratch disk"
mount -t proc proc $R/proc
mount -t sysfs sys $R/sys
mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts $R/dev/pts
mount -t tmpfs -o mode=1777 shm $R/dev/shm
mount -t tmpfs -o mode=0755 run $R/run
mount -t cgroup2 -o nsdelegate cgroup2 $R/sys/fs/cgroup || fail "mount cgroup2"
for d in tmp var-tmp sandbench; do mkdir -p /scratch/$d; done
chmod 1777 /scratch/tmp /scratch/var-tmp
mount --bind /scratch/tmp $R/tmp || fail "bind /tmp"
mount --bind /scratch/var-tmp $R/var/tmp || fail "bind /var/tmp"
if [ -d $R/var/lib/sandbench ]; then
  mount --bind /scratch/sandbench $R/var/lib/sandbench || fail "bind /var/lib/sandbench"
fi
i=0
for share in $SHARES; do
  mkdir -p "$R$share" 2>/dev/null
  mount -t 9p -o "$OPTS9P,cache=loose" "share$i" "$R$share" || fail "mount $share"
  i=$((i + 1))
done
hostname "$NAME"
ip link set lo up

CG=$R/sys/fs/cgroup
echo "+cpu +cpuset +memory +pids +io" >$CG/cgroup.subtree_control || fail "enable controllers"
if [ "$PLACEMENT" = delegated ]; then
  # What systemd does for a unit with Delegate=yes: the controllers enabled down to the
  # unit's parent, the unit's cgroup marked delegated (trusted.delegate), the command in it.
  slice=$CG${SERVICE%/*}
  mkdir -p "$slice" "$CG$SERVICE" || fail "create $SERVICE"
  echo "+cpu +cpuset +memory +pids +io" >"$slice/cgroup.subtree_control" || fail "delegate"
  chroot $R /usr/bin/python3 -I -S -c \
    "import os, sys; os.setxattr(sys.argv[1], 'trusted.delegate', b'1')" "/sys/fs/cgroup$SERVICE" \
    || fail "mark $SERVICE delegated"
fi

OUT=$(port_named sandbench) || fail "no virtio-serial port sandbench (stdout)"
ERR=$(port_named sandbench-stderr) || fail "no virtio-serial port sandbench-stderr"
# Make the new root the mount namespace's root, as switch_root does, but keep this shell (and its
# busybox, /dev, /sys) on the initramfs: a command that is merely chrooted is refused user
# namespaces (unshare(CLONE_NEWUSER) is EPERM in a chroot), which no real lab host does.
cd $R || fail "cd $R"
mount --move . / || fail "move the new root to /"
say "ready"
(
  [ "$PLACEMENT" = delegated ] && echo 0 >"./sys/fs/cgroup$SERVICE/cgroup.procs"
  eval "exec chroot . /usr/bin/env -i $GUEST_ENV /bin/sh -c 'cd \"\$0\" && exec \"\$@\"' $CWD $ARGV"
) </dev/null >"$OUT" 2>"$ERR"
status=$?
# The shared directories use the guest's page cache: write everything back before power-off.
sync
for share in $SHARES; do umount ".$share" 2>/dev/null; done
finish "$status"
