#!/bin/sh
# Starts QEMU's qemu-vmsr-helper for the bench inside the private mount namespace this script runs
# in (unshare -m --propagation private): the fake MSR files are bind-mounted over /dev/cpu, where
# that helper reads them, and /sys/class/powercap/intel-rapl/enabled (which it checks) is made on a
# tmpfs. Nothing outside the namespace changes.
# Prints "process PID detached" (the helper's pid) once the helper runs on its own; its output goes to LOG.
#   start-in-namespace.sh FAKE_DEV_CPU SOCKET GDB_SCRIPT|- LOG
set -eu
dev_cpu=$1 sock=$2 gdb_script=$3 log=$4
mkdir -p /dev/cpu
mount --bind "$dev_cpu" /dev/cpu
mount -t tmpfs bench-sys-class /sys/class
mkdir -p /sys/class/powercap/intel-rapl
echo 1 > /sys/class/powercap/intel-rapl/enabled
if [ "$gdb_script" = - ]; then
  /usr/bin/qemu-vmsr-helper -k "$sock" </dev/null >"$log" 2>&1 &
  echo "process $!) detached"
else
  gdb -batch -x "$gdb_script" --args /usr/bin/qemu-vmsr-helper -k "$sock" </dev/null >"$log" 2>&1 || true
  grep -o 'process [0-9]*) detached' "$log" || { cat "$log" >&2; exit 1; }
fi
