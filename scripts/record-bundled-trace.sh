#!/bin/sh
# Re-creates traces/qemu-spin-vs-idle.jsonl.gz with the project's own recorder, from real QEMU guests
# (test/fixtures/guest/spin.elf): vm-spin (all vCPUs busy), vm-idle (all halted) and vm-boot (boot vCPU
# busy, stopped part-way so an ended VM appears), 2 vCPUs on 2 virtual sockets each, synthetic energy
# (no RAPL needed). Needs qemu-system-x86_64 and a build (npm run build). Usage: scripts/record-bundled-trace.sh [OUT]
set -eu
cd "$(dirname "$0")/.."
OUT=${1:-traces/qemu-spin-vs-idle.jsonl.gz}
SAMPLES=${SAMPLES:-40}
STOP_AFTER=${STOP_AFTER:-20}
ELF=test/fixtures/guest/spin.elf
DIR=$(mktemp -d)
PIDS=""
cleanup() {
  for p in $PIDS; do kill "$p" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM # exit runs cleanup; without it the script would go on after ^C
if [ -w /dev/kvm ]; then ACCEL=kvm; else ACCEL=tcg,thread=multi; fi

start_vm() { # NAME MODE
  qemu-system-x86_64 -accel "$ACCEL" -smp 2,sockets=2,cores=1,threads=1 -m 64 -nodefaults -display none \
    -kernel "$ELF" -append "mode=$2" -name "$1,debug-threads=on" \
    -qmp "unix:$DIR/$1.qmp,server=on,wait=off" >"$DIR/$1.log" 2>&1 </dev/null &
  PIDS="$PIDS $!"
  eval "PID_$(echo "$1" | tr - _)=$!"
}
start_vm vm-spin a
start_vm vm-idle i
start_vm vm-boot b
for n in vm-spin vm-idle vm-boot; do
  i=0; until [ -S "$DIR/$n.qmp" ]; do i=$((i + 1)); [ $i -lt 100 ] || { cat "$DIR/$n.log"; exit 1; }; sleep 0.1; done
done
sleep "${BOOT_WAIT:-6}" # booting costs seconds of CPU on the boot vCPU of every guest

node dist/src/bin/vmsr-helper.js record \
  --qmp "$DIR/vm-spin.qmp" --qmp "$DIR/vm-idle.qmp" --qmp "$DIR/vm-boot.qmp" \
  -o "$OUT" --energy-source synthetic --duration "$SAMPLES" \
  --note "bundled example: scripts/record-bundled-trace.sh on $(uname -m), QEMU $(qemu-system-x86_64 --version | head -1 | sed 's/QEMU emulator version //'), accel $ACCEL; vm-boot killed after ${STOP_AFTER} s" &
REC=$!
PIDS="$PIDS $REC" # a background job ignores ^C: cleanup's SIGTERM ends it (it closes the trace)
sleep "$STOP_AFTER"
kill "$PID_vm_boot"
wait "$REC"
echo "wrote $OUT"
