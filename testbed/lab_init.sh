#!/bin/busybox sh
# A lab host's initramfs init (testbed/lab.py): this machine's root, read-only over 9p, under an
# overlay whose upper layer is the guest's own scratch disk, then systemd as PID 1.
#
# The identity file (its host path in sandbench.lab= on the kernel command line) sets NAME,
# ADDRESS (CIDR), MAC, HOSTS (lines for /etc/hosts) and AUTHORIZED_KEY. On the first boot of a
# scratch disk the guest is made a host of its own on the overlay: hostname, machine-id, SSH host
# key, root's authorized key, a static address on the lab network (systemd-networkd), none of
# this machine's enabled services and none of its sandbench state (keys, /etc/sandbench, /opt).
# Later boots (a reboot, a power cut) find the disk made and go straight to systemd.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

say() { echo "sandbench-lab: $*" >/dev/console; }
fail() { say "FAILED: $*"; sleep 2; poweroff -f; }

for m in $(cat /modules.order); do
  [ -n "$m" ] && { insmod "/lib/modules/$m.ko" || fail "insmod $m"; }
done

IDENTITY=
for arg in $(cat /proc/cmdline); do
  case "$arg" in sandbench.lab=*) IDENTITY="${arg#sandbench.lab=}" ;; esac
done
[ -n "$IDENTITY" ] || fail "no sandbench.lab= on the kernel command line"

OPTS9P="trans=virtio,version=9p2000.L,msize=512000"
mkdir -p /lower /scratch /newroot
mount -t 9p -o "$OPTS9P,ro,cache=loose" hostroot /lower || fail "mount this machine's root"
[ -r "/lower$IDENTITY" ] || fail "identity file $IDENTITY not visible in the guest"
. "/lower$IDENTITY"
mount -t ext4 /dev/vda /scratch || fail "mount the scratch disk"
mkdir -p /scratch/upper /scratch/work /scratch/var-tmp /scratch/tmp
chmod 1777 /scratch/var-tmp /scratch/tmp
mount -t overlay overlay -o lowerdir=/lower,upperdir=/scratch/upper,workdir=/scratch/work \
  /newroot || fail "mount the overlay root"
R=/newroot
mount -t proc proc $R/proc
mount -t sysfs sys $R/sys
mount -t devtmpfs dev $R/dev
# The work root on the scratch disk's own file system, not through the overlay.
mount --bind /scratch/var-tmp $R/var/tmp || fail "bind /var/tmp"
# The guest's own /tmp: systemd-tmpfiles empties /tmp at boot, and through the overlay that
# would mean a whiteout for every entry of this machine's /tmp (minutes under TCG).
mount --bind /scratch/tmp $R/tmp || fail "bind /tmp"
# The lab's shared directory (wheelhouse), read-only, where a USB stick would be.
mkdir -p $R/media/lab
mount -t 9p -o "$OPTS9P,ro" labshare $R/media/lab || fail "mount the lab share"

first_boot() {
  say "first boot of $NAME: making it a host of its own"
  echo "$NAME" >$R/etc/hostname
  cat /proc/sys/kernel/random/uuid | tr -d '-' >$R/etc/machine-id
  printf '127.0.0.1 localhost\n127.0.1.1 %s\n%s\n' "$NAME" "$HOSTS" >$R/etc/hosts
  # None of this machine's sandbench state, services or SSH identity.
  rm -rf $R/var/lib/sandbench $R/etc/sandbench $R/opt/sandbench $R/var/lib/sandbench-lab
  rm -f $R/etc/ssh/ssh_host_* $R/.dockerenv $R/run/.containerenv  # a host, not a container
  for link in $R/etc/systemd/system/*.wants/* $R/etc/systemd/system/redis.service; do
    [ -L "$link" ] && rm -f "$link"
  done
  chroot $R /usr/bin/ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key \
    || fail "ssh host key"
  mkdir -p $R/etc/ssh/sshd_config.d $R/root/.ssh $R/etc/systemd/network $R/var/log/journal
  # No PAM: a root login by key opens no logind session and no user manager (seconds of TCG).
  printf "HostKey /etc/ssh/ssh_host_ed25519_key\nUsePAM no\n" >$R/etc/ssh/sshd_config.d/lab.conf
  echo "$AUTHORIZED_KEY" >$R/root/.ssh/authorized_keys
  chmod 700 $R/root/.ssh; chmod 600 $R/root/.ssh/authorized_keys
  printf '[Match]\nMACAddress=%s\n\n[Network]\nAddress=%s\n' "$MAC" "$ADDRESS" \
    >$R/etc/systemd/network/10-lab.network
  chroot $R /bin/systemctl --quiet set-default multi-user.target || fail "default target"
  chroot $R /bin/systemctl --quiet enable systemd-networkd.service ssh.service \
    || fail "enable systemd-networkd and ssh"
  touch /scratch/made
  sync
}
[ -e /scratch/made ] || first_boot
say "network devices: $(ls /sys/class/net | tr "\n" " ")"
say "switching to systemd on $NAME"
umount /proc /sys /dev 2>/dev/null
exec switch_root $R /lib/systemd/systemd
