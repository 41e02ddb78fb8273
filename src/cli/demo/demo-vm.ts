/** The demo's VM, to discovery a QEMU/KVM (`CPU <n>/KVM` threads, -name, -uuid, -smp): vCPU 0 half busy, others idle; prints `ready <tid> ...` once they are named. */
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import { gettid, setThreadName } from '../../os/libc/processes.js';

/** Of each period, a busy vCPU spins this long and sleeps the rest. */
const PERIOD_MS = 100;
const BUSY_MS = 50;

function vcpu(index: number): void {
  setThreadName(`CPU ${index}/KVM`);
  parentPort!.postMessage(gettid());
  const cell = new Int32Array(new SharedArrayBuffer(4));
  for (;;) {
    if (index === 0) {
      const until = Date.now() + BUSY_MS;
      while (Date.now() < until) {
        /* spin: the guest is busy */
      }
      Atomics.wait(cell, 0, 0, PERIOD_MS - BUSY_MS);
    } else {
      Atomics.wait(cell, 0, 0, 60_000); // halted
    }
  }
}

function smpOf(args: readonly string[]): number {
  const i = args.indexOf('-smp');
  const n = i < 0 ? 1 : Number.parseInt(args[i + 1] ?? '', 10);
  return Number.isInteger(n) && n >= 1 && n <= 8 ? n : 1;
}

if (isMainThread) {
  const n = smpOf(process.argv.slice(2));
  const tids: number[] = [];
  for (let i = 0; i < n; i++) {
    const w = new Worker(new URL(import.meta.url), { workerData: i });
    tids.push(await new Promise<number>((resolve, reject) => (w.once('message', resolve), w.once('error', reject))));
  }
  process.stdout.write(`ready ${tids.join(' ')}\n`);
  process.on('SIGTERM', () => process.exit(0));
  process.on('SIGINT', () => process.exit(0));
} else {
  vcpu(workerData as number);
}
