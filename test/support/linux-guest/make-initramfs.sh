#!/bin/sh
# Builds a busybox initramfs for the guest-directory test (test/guest-dir/linux-guest.e2e.test.ts) in
# OUT (a new directory the caller removes), from the installed Debian packages linux-image-amd64 and
# busybox-static: the virtio and 9p modules of the newest installed kernel (those not built in), and
# an /init that mounts the 9p tag "vmsr", reads every energy_uj each second while a loop spins, and
# prints them on the serial console. Prints the kernel's path on success.
# Usage: make-initramfs.sh OUT SECONDS
set -eu
out=$1
secs=$2
kver=$(ls /usr/lib/modules | sort -V | tail -1)
[ -n "$kver" ] && [ -e "/boot/vmlinuz-$kver" ] || { echo "no kernel in /boot: apt-get install linux-image-amd64" >&2; exit 3; }
[ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || { echo "no busybox: apt-get install busybox-static" >&2; exit 3; }
bb=$(command -v busybox)
file "$bb" 2>/dev/null | grep -q 'dynamically' && { echo "$bb is not static: apt-get install busybox-static" >&2; exit 3; }
root="$out/root"
mkdir -p "$root/bin" "$root/lib/modules" "$root/proc" "$root/sys" "$root/dev" "$root/mnt"
cp "$bb" "$root/bin/busybox"
mods=/usr/lib/modules/$kver
list=""
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci netfs fscache 9pnet 9pnet_virtio 9p; do
  if grep -qE "/$m\.ko" "$mods/modules.builtin"; then continue; fi
  f=$(find "$mods/kernel" -name "$m.ko" -o -name "$m.ko.xz" -o -name "$m.ko.zst" | head -1)
  [ -n "$f" ] || { echo "module $m not found in $mods" >&2; exit 3; }
  case "$f" in
    *.xz) xz -dc "$f" > "$root/lib/modules/$m.ko" ;;
    *.zst) zstd -qdc "$f" > "$root/lib/modules/$m.ko" ;;
    *) cp "$f" "$root/lib/modules/$m.ko" ;;
  esac
  list="$list $m"
done
cat > "$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $list; do insmod /lib/modules/\$m.ko || echo "GUEST insmod \$m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro vmsr /mnt || echo "GUEST mount failed"
echo "GUEST zones \$(cd /mnt && echo intel-rapl:*)"
( while :; do :; done ) &
i=0
while [ \$i -lt $secs ]; do
  line="GUEST t=\$i"
  for z in /mnt/intel-rapl:*; do line="\$line \$(cat \$z/name)=\$(cat \$z/energy_uj)"; done
  echo "\$line"
  sleep 1
  i=\$((i+1))
done
echo "GUEST done"
poweroff -f
INIT
chmod 755 "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$out/initramfs.gz"
echo "/boot/vmlinuz-$kver"
