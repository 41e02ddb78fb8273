/**
 * The cost of one legacy MSR_PKG_ENERGY_STATUS request in `--guest-energy exact` against `raw`, in
 * the daemon's own code path (LegacyService.answer, the hook, GuestEnergy): requests come as QEMU
 * sends them on a one-package host, a window's start read then its end read 1 s later (on a clock
 * the bench advances), so every request is one QEMU makes. The "VM" is this process (its threads
 * read from /proc as a QEMU's would be: about 10 here); raw reads the fake host's MSR file.
 * Goal (docs/guest-energy.md): exact costs at most 1.2x raw. Prints ratios; never fails on timing.
 */
import pino from 'pino';
import { FakeHost, legacyOnFakeHost } from '../test/support/fake-host.js';
import { MsrDevice } from '../src/msr/device.js';
import { GuestEnergy } from '../src/helper/guest/guest-energy.js';
import { MSR_PKG_ENERGY_STATUS, MSR_RAPL_POWER_UNIT } from '../src/msr/registers.js';
import type { LegacyRequest } from '../src/protocol/legacy.js';

const PAIRS = 3000;
const ROUNDS = 3;

export async function run(): Promise<void> {
  const fake = new FakeHost({ packages: [0, 0] });
  const log = pino({ level: 'silent' });
  const device = new MsrDevice(fake.msrPathTemplate);
  const legacy = legacyOnFakeHost(fake, device, log);
  const verdicts = legacy.verdictsFor(process.pid);
  const req: LegacyRequest = { msr: MSR_PKG_ENERGY_STATUS, cpu: 0, tid: process.pid };
  const out = Buffer.alloc(8);
  let now = 1_000_000_000n;
  const guest = new GuestEnergy({
    procRoot: '/proc',
    host: {
      vendor: 'intel',
      clkTck: 100,
      cpus: [
        { cpu: 0, pkg: 0 },
        { cpu: 1, pkg: 0 },
      ],
      packages: [{ pkg: 0, powerUnit: 0xa0e03n }],
    },
    unitJ: 2 ** -14,
    find: (pid) =>
      pid === process.pid
        ? { vmId: 1, pid, starttime: 1, vcpus: new Map([[process.pid + 1, 0]]), nvpkg: 1, exactJ: Number(now) / 1e9 }
        : undefined,
    log,
    clock: () => now,
    maxThreads: 4608,
    versionOf: () => Promise.resolve('10.0.2'),
  });
  // One request as QEMU's vmsr thread makes it: the start read, then (1 s later) the end read.
  const pair = () => {
    legacy.answer(process.pid, req, verdicts, out, 0);
    now += 1_000_000_000n;
    legacy.answer(process.pid, req, verdicts, out, 0);
    now += 2_000_000n;
  };
  const time = (n: number) => {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < n; i++) pair();
    return Number(process.hrtime.bigint() - t0) / 1000 / (2 * n);
  };
  console.log(`guest energy: one MSR_PKG_ENERGY_STATUS request, µs, ${PAIRS} windows a round, this process as the VM`);
  legacy.answer(process.pid, { ...req, msr: MSR_RAPL_POWER_UNIT }, verdicts, out, 0);
  for (let round = 1; round <= ROUNDS; round++) {
    legacy.setEnergyStatus(() => undefined);
    time(100);
    const raw = time(PAIRS);
    legacy.setEnergyStatus((pid, cpu) => guest.answer(pid, cpu));
    time(2);
    await new Promise((r) => setTimeout(r, 10)); // the version read resolves
    time(100);
    const exact = time(PAIRS);
    console.log(`  round ${round}: raw ${raw.toFixed(2)}  exact ${exact.toFixed(2)}  exact/raw ${(exact / raw).toFixed(2)}x (goal 1.2x)`);
  }
  device.close?.();
  fake.cleanup();
}
