/**
 * The drop-in proven with a real QEMU 10: a guest reads its virtual RAPL MSRs through vmsr-helper.
 *
 * Real parts only: the helper is the built daemon (child process), QEMU is the installed
 * qemu-system-x86_64 with -accel kvm,rapl=true,rapl-helper-socket=SOCK, the guest
 * (test/fixtures/guest, mode r) executes RDMSR and prints what it got on COM1. The one fake is the
 * MSR device: FakeHost files read with pread at offset = MSR. QEMU is let past its Intel-only
 * start-up checks as test/support/rapl-qemu.ts explains; nothing in between is touched.
 *
 * The guest's 0x611 is QEMU's own per-vCPU split of the package counter (QEMU asks the helper for
 * the raw counter every second); test/support/qemu-vmsr-model.ts derives the bounds checked here.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { synthValue, DEFAULT_AMD_SYNTH } from '../../src/msr/legacy-registers.js';
import { MSR_AMD_RAPL_POWER_UNIT, MSR_PKG_POWER_INFO, MSR_PKG_POWER_LIMIT, MSR_RAPL_POWER_UNIT } from '../../src/msr/registers.js';
import { resolveId } from '../../src/os/privileges/accounts.js';
import { parseProcStatus } from '../../src/os/privileges/proc-status.js';
import { hostArgs, LegacyClient, startHelper, tempDir, waitFor, type DaemonChild } from '../daemon/support/daemon-process.js';
import { EnergyPump } from '../support/energy-pump.js';
import type { FakeHost } from '../support/fake-host.js';
import { raplFakeHost } from '../support/rapl-host.js';
import { clockTicksPerSecond, guestGrowthBounds, qemuMaxTicks } from '../support/qemu-vmsr-model.js';
import {
  GuestSerial,
  qemuThreadTicks,
  qemuVmsrHelperMissing,
  raplQemuMissing,
  startQemuVmsrHelper,
  startRaplQemu,
  type RaplQemu,
} from '../support/rapl-qemu.js';

const cleanups: (() => Promise<unknown> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** Package counter start (top byte 0x2a stays put during a test: see writePackageCounter32) and rate. */
const E0 = 0x2a00_0000;
/** 120 000 units/s: 7.3 W at Intel's 2^-14 J unit, 1.8 W at AMD's 2^-16 J. */
const RATE = 120_000;
const LONG = 300_000;

/** The 8 bytes at offset = MSR of cpu 0's file, what the msr driver would return. */
function fileMsr(host: FakeHost, msr: number): bigint {
  const b = Buffer.alloc(8);
  const fd = fs.openSync(host.msrPath(0), 'r');
  try {
    fs.readSync(fd, b, 0, 8, msr);
  } finally {
    fs.closeSync(fd);
  }
  return b.readBigUInt64LE(0);
}

/** A fake Intel or AMD package whose start-up registers are non-zero, counter at E0; cleaned up after the test. */
function raplHost(vendor: 'intel' | 'amd'): { host: FakeHost; energyMsr: number } {
  const made = raplFakeHost(vendor, E0);
  cleanups.push(() => made.host.cleanup());
  return made;
}

/** What the helper answers a QEMU-style client for the three start-up registers, now. */
async function helperStartupValues(sock: string): Promise<bigint[]> {
  const c = await LegacyClient.connect(sock);
  try {
    const out: bigint[] = [];
    for (const msr of [MSR_RAPL_POWER_UNIT, MSR_PKG_POWER_LIMIT, MSR_PKG_POWER_INFO]) out.push(await c.request(msr, 0, process.pid));
    return out;
  } finally {
    c.close();
  }
}

async function helper(args: string[]): Promise<DaemonChild> {
  const h = await startHelper(args);
  cleanups.push(() => h.stop());
  return h;
}

async function qemu(o: Parameters<typeof startRaplQemu>[0]): Promise<{ q: RaplQemu; serial: GuestSerial }> {
  const q = await startRaplQemu(o);
  cleanups.push(() => q.stop());
  return { q, serial: new GuestSerial(q.serialPath) };
}

/** Starts the package counter at E0, RATE units/s; stopped when the test ends. */
function runPump(host: FakeHost, energyMsr: number): EnergyPump {
  const pump = new EnergyPump(host, { msr: energyMsr, start: E0, unitsPerSecond: RATE });
  pump.start();
  cleanups.push(() => pump.stop());
  return pump;
}

/** Runs the counter and checks the guest's 0x611 growth against QEMU's split (see observeGrowth). */
async function expectGrowthWithinQemuSplit(
  label: string,
  host: FakeHost,
  energyMsr: number,
  serial: GuestSerial,
  q: RaplQemu,
  minTicks: number,
) {
  const pump = runPump(host, energyMsr);
  const { growth, bounds } = await observeGrowth(serial, q, pump, minTicks);
  console.log(
    `${label}: guest 0x611 grew ${growth} units; QEMU's split allows [${Math.round(bounds.low)}, ${Math.round(bounds.high)}], centre ${Math.round(bounds.expected)}`,
  );
  expect(growth).toBeGreaterThan(0);
  expect(growth).toBeGreaterThanOrEqual(bounds.low);
  expect(growth).toBeLessThanOrEqual(bounds.high);
  expectMonotonic(serial);
}

async function guestStartupValues(serial: GuestSerial, q: RaplQemu): Promise<bigint[]> {
  await serial.waitFor(
    () => [0x606, 0x610, 0x614].every((m) => serial.first(m) !== undefined),
    'the guest to print 0x606, 0x610, 0x614',
    60_000,
    q,
  );
  return [0x606, 0x610, 0x614].map((m) => serial.first(m)!);
}

/**
 * Watches the guest's 0x611 while the package counter runs: from one freshly printed line (A) until
 * the vCPU has had `minTicks` of CPU and a later line (B) appears. Returns growth and /proc ticks.
 */
async function observeGrowth(serial: GuestSerial, q: RaplQemu, pump: EnergyPump, minTicks: number) {
  // QEMU's first period with the counter running must be over before A: wait for the first growth.
  const base = serial.energy().at(-1)?.value ?? 0n;
  await serial.waitFor(() => serial.energy().some((l) => l.value > base), 'the guest 0x611 to start growing', 60_000, q);
  const nextLine = async (what: string) => {
    const n = serial.energy().length;
    await serial.waitFor(() => serial.energy().length > n, what, 30_000, q);
    return { line: serial.energy().at(-1)!, ticks: qemuThreadTicks(q.pid), at: performance.now() };
  };
  const a = await nextLine('a guest 0x611 line (A)');
  const end = Date.now() + 150_000;
  while (qemuThreadTicks(q.pid).vcpu - a.ticks.vcpu < minTicks) {
    if (Date.now() > end) throw new Error(`the vCPU got under ${minTicks} ticks in 150 s: host too loaded`);
    await new Promise((r) => setTimeout(r, 250));
    serial.poll();
  }
  const b = await nextLine('a guest 0x611 line (B)');
  const bounds = guestGrowthBounds({
    rate: RATE,
    vcpuTicks: b.ticks.vcpu - a.ticks.vcpu,
    otherTicks: b.ticks.other - a.ticks.other,
    spanS: (b.at - a.at) / 1000,
    writerGapS: pump.maxGapS,
    clkTck: clockTicksPerSecond(),
    maxTicks: qemuMaxTicks(0),
  });
  return { growth: Number(b.line.value - a.line.value), bounds, a, b };
}

function expectMonotonic(serial: GuestSerial): void {
  const v = serial.energy().map((l) => l.value);
  for (let i = 1; i < v.length; i++) expect(v[i]!, `0x611 line ${i} never decreases`).toBeGreaterThanOrEqual(v[i - 1]!);
}

/** The account libvirt runs QEMU as on Debian (libvirt-qemu), or nobody; with /dev/kvm's group. */
function qemuAccount(): { uid: number; gid: number; name: string } {
  const gid = fs.statSync('/dev/kvm').gid;
  for (const name of ['libvirt-qemu', 'nobody']) {
    try {
      const uid = resolveId(name, 'user');
      if (uid !== 0) return { uid, gid, name };
    } catch {
      /* not on this machine */
    }
  }
  throw new Error('no libvirt-qemu or nobody account to run QEMU as');
}

/**
 * A temp dir the QEMU account can reach: the dir itself traversable (0711), a subdir it owns for
 * the serial log and pidfile.
 */
function dirs(account?: { uid: number; gid: number }): { dir: string; qemuDir: string; sock: string } {
  const dir = tempDir('vmsr-rapl-');
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.chmodSync(dir, 0o711);
  const qemuDir = path.join(dir, 'qemu');
  fs.mkdirSync(qemuDir, { mode: 0o700 });
  if (account) fs.chownSync(qemuDir, account.uid, account.gid);
  return { dir, qemuDir, sock: path.join(dir, 'vmsr.sock') };
}

/** A test needing a RAPL QEMU (or `missing` says what else): skipped with the reason when it cannot run here. */
function raplTest(name: string, body: () => Promise<void>, missing: () => string | null = raplQemuMissing): void {
  test(
    name,
    async (ctx) => {
      const why = missing();
      if (why) return ctx.skip(why);
      await body();
    },
    LONG,
  );
}

describe('a real QEMU 10 guest reads its virtual RAPL MSRs through vmsr-helper', () => {
  raplTest(
    "guest sees the exact 0x606/0x610/0x614 and a 0x611 growing within the bounds of QEMU's split, when QEMU runs as libvirt's non-root user through the socket's group",
    async () => {
      const account = qemuAccount();
      const { host, energyMsr } = raplHost('intel');
      const { qemuDir, sock } = dirs(account);
      // What the README tells operators without systemd (the socket unit's SocketGroup=/SocketMode=).
      const h = await helper([
        '-k',
        sock,
        ...hostArgs(host, 'intel'),
        '-T',
        'server',
        '--socket-group',
        String(account.gid),
        '--socket-mode',
        '0660',
      ]);
      const st = fs.statSync(sock);
      expect([st.gid, st.mode & 0o777]).toEqual([account.gid, 0o660]);
      const want = await helperStartupValues(sock);
      expect(want).toEqual([MSR_RAPL_POWER_UNIT, MSR_PKG_POWER_LIMIT, MSR_PKG_POWER_INFO].map((m) => fileMsr(host, m)));

      const { q, serial } = await qemu({ socket: sock, dir: qemuDir, name: 'rapl-intel', user: account });
      const status = parseProcStatus(fs.readFileSync(`/proc/${q.pid}/status`, 'utf8'));
      expect(status.uid, `QEMU runs as ${account.name}`).toEqual([account.uid, account.uid, account.uid, account.uid]);
      expect(status.gid).toEqual([account.gid, account.gid, account.gid, account.gid]);
      expect(status.groups, 'no supplementary groups: the socket is reached through the gid alone').toEqual([]);
      // The helper saw QEMU's connection with QEMU's credentials (SO_PEERCRED), not root's.
      expect(h.stderr()).toMatch(new RegExp(`"peer":${q.pid},"uid":${account.uid},"msg":"client connected"`));

      expect(await guestStartupValues(serial, q)).toEqual(want);

      await expectGrowthWithinQemuSplit('intel', host, energyMsr, serial, q, 600);
      // The start-up registers never change for the guest (QEMU read them once).
      expect([0x606, 0x610, 0x614].map((m) => serial.lines.filter((l) => l.msr === m).length)).toEqual([1, 1, 1]);
    },
  );

  raplTest(
    'QEMU running as a non-root user refuses to start with rapl=true when the socket lacks the group permission; -run-with user= connects before switching, as root',
    async () => {
      const account = qemuAccount();
      const { host } = raplHost('intel');
      const { qemuDir, sock } = dirs(account);
      const h = await helper(['-k', sock, ...hostArgs(host, 'intel'), '-T', 'server']);
      expect(fs.statSync(sock).mode & 0o777, 'the default socket mode').toBe(0o600);
      await expect(startRaplQemu({ socket: sock, dir: qemuDir, name: 'rapl-denied', user: account, timeoutMs: 60_000 })).rejects.toThrow(
        /vmsr socket opening failed/,
      );
      // QEMU's own user switch (-run-with user=) comes after the accelerator is set up: such a QEMU
      // connects as root, so the socket's permissions do not matter for it (docs/qemu.md says so).
      const { q } = await qemu({ socket: sock, dir: qemuDir, name: 'rapl-run-with', extraArgs: ['-run-with', `user=${account.name}`] });
      await waitFor(() => h.stderr().includes(`"peer":${q.pid},"uid":0,"msg":"client connected"`), 'the root connection', h);
      await waitFor(
        () => parseProcStatus(fs.readFileSync(`/proc/${q.pid}/status`, 'utf8')).uid[0] === account.uid,
        'QEMU to switch user',
        h,
      );
    },
  );

  raplTest(
    'on an AMD host (--vendor amd) the guest gets Intel-format values: the AMD unit, synthesised 0x610/0x614, and the AMD package counter growing',
    async () => {
      const { host, energyMsr } = raplHost('amd');
      const { qemuDir, sock } = dirs();
      await helper(['-k', sock, ...hostArgs(host, 'amd')]);
      const unit = fileMsr(host, MSR_AMD_RAPL_POWER_UNIT);
      expect(unit).toBe(0xa1003n);
      const want = [unit, synthValue('power-limit', unit, DEFAULT_AMD_SYNTH), synthValue('power-info', unit, DEFAULT_AMD_SYNTH)];
      expect(await helperStartupValues(sock)).toEqual(want);

      const { q, serial } = await qemu({ socket: sock, dir: qemuDir, name: 'rapl-amd' });
      expect(await guestStartupValues(serial, q)).toEqual(want);

      await expectGrowthWithinQemuSplit('amd', host, energyMsr, serial, q, 300);
    },
  );

  raplTest(
    "helper restarted while QEMU runs: the guest's 0x611 freezes for good (QEMU never reconnects) and a restarted VM gets energy again",
    async () => {
      const { host, energyMsr } = raplHost('intel');
      const { qemuDir, sock } = dirs();
      const first = await helper(['-k', sock, ...hostArgs(host, 'intel'), '-T', 'server']);
      const { q, serial } = await qemu({ socket: sock, dir: qemuDir, name: 'rapl-restart' });
      await guestStartupValues(serial, q);
      runPump(host, energyMsr);
      const base = serial.energy().at(-1)?.value ?? 0n;
      await serial.waitFor(() => serial.energy().filter((l) => l.value > base).length >= 2, 'the guest 0x611 to grow', 60_000, q);

      const stderrBefore = q.stderr();
      expect(await first.stop()).toBe(0);
      const killedAt = Date.now();
      // The period in flight when the helper went away reads 0 at its end (e_end <= e_start: no
      // energy); after it, every read fails the same way. What QEMU still adds is its carried
      // non-vCPU term divided by an ever larger count (a few units, gone within two periods), so
      // wait four seconds, then watch.
      await serial.waitFor(
        () => serial.energy().some((l) => l.seenAt > killedAt + 4000),
        'a guest line 4 s after the helper stopped',
        30_000,
        q,
      );
      const frozen = serial.energy().at(-1)!.value;
      const linesAt = serial.energy().length;
      await serial.waitFor(
        () => serial.energy().length >= linesAt + 3 && Date.now() > killedAt + 10_000,
        'three more guest lines',
        60_000,
        q,
      );
      expect(
        new Set(
          serial
            .energy()
            .slice(linesAt - 1)
            .map((l) => l.value),
        ),
        'no energy while the helper is down',
      ).toEqual(new Set([frozen]));

      // The operator restarts the helper on the same path: QEMU does not reconnect.
      const second = await helper(['-k', sock, ...hostArgs(host, 'intel'), '-T', 'server']);
      const restartedAt = Date.now();
      const linesAt2 = serial.energy().length;
      await serial.waitFor(
        () => serial.energy().length >= linesAt2 + 3 && Date.now() > restartedAt + 6000,
        'three guest lines after the restart',
        60_000,
        q,
      );
      expect(q.alive(), 'QEMU keeps running').toBe(true);
      expect(
        new Set(
          serial
            .energy()
            .slice(linesAt - 1)
            .map((l) => l.value),
        ),
        'still frozen after the helper is back',
      ).toEqual(new Set([frozen]));
      expect(second.stderr(), 'QEMU never connected to the new helper').not.toMatch(/client connected/);
      expect(q.stderr(), 'QEMU says nothing about the lost helper').toBe(stderrBefore);

      // What the README tells the operator: restart the VM. The new QEMU connects and counts again.
      await q.stop();
      const again = await qemu({ socket: sock, dir: qemuDir, name: 'rapl-restart-2' });
      await guestStartupValues(again.serial, again.q);
      expect(second.stderr()).toMatch(new RegExp(`"peer":${again.q.pid},"uid":0,"msg":"client connected"`));
      const base2 = again.serial.energy().at(-1)?.value ?? 0n;
      await again.serial.waitFor(() => again.serial.energy().some((l) => l.value > base2), 'the new guest 0x611 to grow', 60_000, again.q);
    },
  );

  raplTest(
    "the same guest reads the same 0x606/0x610/0x614 through vmsr-helper and through QEMU's own qemu-vmsr-helper 10.0.2",
    async () => {
      const { host } = raplHost('intel');
      const { qemuDir, dir } = dirs();
      const ourSock = path.join(dir, 'ours.sock');
      const theirSock = path.join(dir, 'qemu-vmsr-helper.sock');

      const ours = await helper(['-k', ourSock, ...hostArgs(host, 'intel')]);
      const viaOurs = await qemu({ socket: ourSock, dir: qemuDir, name: 'rapl-ours' });
      const seenOurs = await guestStartupValues(viaOurs.serial, viaOurs.q);
      await viaOurs.q.stop();
      await ours.stop();

      const theirs = await startQemuVmsrHelper(theirSock, path.join(host.dir, 'dev/cpu'));
      cleanups.push(() => theirs.stop());
      const viaTheirs = await qemu({ socket: theirSock, dir: qemuDir, name: 'rapl-theirs' });
      const seenTheirs = await guestStartupValues(viaTheirs.serial, viaTheirs.q);

      expect(seenOurs).toEqual(seenTheirs);
      expect(seenOurs).toEqual([MSR_RAPL_POWER_UNIT, MSR_PKG_POWER_LIMIT, MSR_PKG_POWER_INFO].map((m) => fileMsr(host, m)));
      console.log(`side by side: both helpers gave the guest ${seenOurs.map((v) => `0x${v.toString(16)}`).join(' ')}`);
    },
    qemuVmsrHelperMissing,
  );
});
