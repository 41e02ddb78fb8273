/**
 * The soak of `--guest-energy exact` (docs/guest-energy.md, "Thread exits"): a real QEMU 10
 * under a random mix of the churns a user makes with QEMU's commands (migrations cancelled or
 * completed and resumed, iothreads added and removed, system_reset) for VMSR_GUEST_SOAK_MINUTES
 * (default 10) minutes; every 20-window span, each single window and the garbage counter. It is the
 * last test of test/e2e/guest-energy.e2e.test.ts, which skips it unless that variable is set; run
 * only when named (`npm run bench -- guest-energy-soak`), never with the other suites.
 */
import { spawnSync } from 'node:child_process';

export function run(): void {
  const minutes = process.env.VMSR_GUEST_SOAK_MINUTES ?? '10';
  console.log(`guest energy soak: ${minutes} minutes of random churn on a real QEMU 10 (skips, saying why, without QEMU, KVM or root)`);
  const r = spawnSync('npx', ['vitest', 'run', 'test/e2e/guest-energy.e2e.test.ts', '-t', 'soak'], {
    stdio: 'inherit',
    env: { ...process.env, VMSR_GUEST_SOAK_MINUTES: minutes },
  });
  if (r.status !== 0) console.log(`guest energy soak: the run failed (exit ${r.status ?? r.signal}): its figures are above`);
}
