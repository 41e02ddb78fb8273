/**
 * Per-VM power limits end to end (docs/power-limits.md): the real daemon on the synthetic source (its
 * package energy follows this host's CPU load), real QEMU guests spinning every vCPU, registered over
 * v2, limited over v2 and from the command line; their cgroup v1 quota files read as the kernel
 * shows them. The host has 2 cores shared with other users' work: every figure is measured from
 * the VM's own UPDATEs, every wait has a deadline far above what it expects and says what it waits
 * for, and the figures are printed (docs/power-limits.md "Accuracy" quotes them).
 */
import { execFile, spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type Update } from '../../src/client/v2-replies.js';
import { ResumingV2Client } from '../../src/client/resuming-client.js';
import { MSR_DRAM_ENERGY_STATUS, MSR_PKG_ENERGY_STATUS } from '../../src/msr/registers.js';
import type { EnergyDomain } from '../../src/model/domains.js';
import { vmSpecFromQmp } from '../../src/client/qmp.js';
import { StatsReader } from '../../src/client/stats-reader.js';
import { cpuMounts } from '../../src/power-limit/cgroups.js';
import { hasKvm, missing, which } from '../support/env.js';
import { removeGroup } from '../support/cgroup.js';
import { qemuMissing, startQemu, waitSettled, type QemuGuest } from '../support/qemu.js';
import {
  BIN,
  defaultKeeperEnv,
  hostArgs,
  listenings,
  servingPid,
  spawnHelper,
  tempDir,
  waitFor,
  type DaemonChild,
} from '../daemon/support/daemon-process.js';
import { FakeHost } from '../support/fake-host.js';
import { startOpenDaemon } from '../daemon/support/open-daemon.js';

const cleanups: (() => Promise<unknown> | unknown)[] = [];
afterEach(async () => {
  // Every cleanup runs, whichever fails: a spinning guest left behind would load the host for good.
  const failed: unknown[] = [];
  for (const c of cleanups.splice(0).reverse())
    await Promise.resolve()
      .then(c)
      .catch((e: unknown) => failed.push(e));
  if (failed.length > 0) throw failed[0];
});

const V1 = cpuMounts(fs.readFileSync('/proc/self/mountinfo', 'utf8')).v1;
const NOBODY = 65534;
/** Debian's `users` (gid 100) stands for the observer group. */
const OBSERVER = { name: 'users', gid: 100 };

function why(): string | null {
  return (
    missing({ root: true }) ??
    qemuMissing() ??
    (V1 === undefined ? "needs the cgroup v1 cpu hierarchy (this project's hosts run it)" : null)
  );
}

/** A VM's power of one domain (the package unless named) over each interval its UPDATEs span: [end time s, watts]. */
class PowerLog {
  readonly points: { t: number; w: number }[] = [];
  private last: Update | null = null;
  constructor(private readonly domain: EnergyDomain = 'package') {}
  add(u: Update): void {
    const uj = (x: Update) =>
      this.domain === 'package' ? x.vpkgs.map((v) => v.energyUj) : (x.domains?.find((d) => d.domain === this.domain)?.vpkgEnergyUj ?? []);
    const e = (x: Update) => Number(uj(x).reduce((s, v) => s + v, 0n)) / 1e6;
    if (this.last !== null && u.tNs > this.last.tNs)
      this.points.push({ t: Number(u.tNs) / 1e9, w: (e(u) - e(this.last)) / (Number(u.tNs - this.last.tNs) / 1e9) });
    this.last = u;
  }
  /** The mean power over the intervals that end in (from, to]. */
  mean(from: number, to: number): number {
    const p = this.points.filter((x) => x.t > from && x.t <= to);
    return p.reduce((s, x) => s + x.w, 0) / Math.max(1, p.length);
  }
  get now(): number {
    return this.points.at(-1)?.t ?? 0;
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Waits until the log holds intervals ending `s` seconds past `from` (deadline: 4 x that, and 30 s more, on a busy host). */
async function until(log: PowerLog, from: number, s: number, what: string): Promise<void> {
  const deadline = Date.now() + 4 * s * 1000 + 30_000;
  while (log.now < from + s) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(200);
  }
}

/**
 * Shares of the groups the tests make (v1 `cpu.shares`; a task's is 1024): the host's other work (tens
 * of runnable tasks on 2 cores, from other users' tests) would leave a spinning guest a tenth of a CPU,
 * at the limiter's floor; with these its guests get about a CPU, where a limit has room to act.
 */
const TEST_SHARES = '32768\n';

/** A cgroup v1 cpu group made for a test, with high shares and `quota`, removed at the end. */
function testGroup(name: string, quota = '-1\n'): string {
  const dir = path.join(V1!, `vmsr-test-${name}-${process.pid}`);
  fs.mkdirSync(dir);
  cleanups.push(() => removeGroup(dir));
  fs.writeFileSync(path.join(dir, 'cpu.shares'), TEST_SHARES);
  fs.writeFileSync(path.join(dir, 'cpu.cfs_quota_us'), quota);
  return dir;
}

/** The share of the CFS periods of the group `dir` in which it was throttled, over `ms` from now. */
async function throttledShare(dir: string, ms: number): Promise<number> {
  const read = () => {
    const t = fs.readFileSync(path.join(dir, 'cpu.stat'), 'utf8');
    return { periods: Number(/^nr_periods (\d+)$/m.exec(t)![1]), throttled: Number(/^nr_throttled (\d+)$/m.exec(t)![1]) };
  };
  const a = read();
  await sleep(ms);
  const b = read();
  return b.periods === a.periods ? 0 : (b.throttled - a.throttled) / (b.periods - a.periods);
}

/** A guest spinning every vCPU, every thread of it moved into the group `dir`. */
async function spinningGuest(name: string, smp: number, dir: string): Promise<QemuGuest> {
  const q = await startQemu({ mode: 'a', smp, sockets: 1, name });
  cleanups.push(() => q.stop());
  for (const tid of fs.readdirSync(`/proc/${q.pid}/task`)) fs.writeFileSync(path.join(dir, 'tasks'), `${tid}\n`);
  expect(await waitSettled(q, 'a', { timeoutMs: 60_000 }), `${name} settled (every vCPU spinning, ${q.accel})`).toBe(true);
  return q;
}

/**
 * The fake MSR's package counter follows this host's CPU load, as a RAPL counter does: the synthetic
 * source's rule (20 W + 40 W x the busy share, dist/'s SyntheticEnergySource) written into the MSR
 * files every 20 ms by a child process in a group with the test's high shares (in the test's own
 * process the host's load stalls the writes, and each stall is an interval's error). It ends with
 * the test, or on its own once its parent is gone. With `dram`, the DRAM register follows the same
 * rule with a fifth of the watts (4 W + 8 W x the busy share), so the helper reads and attributes it.
 */
function loadFollowingMsr(fake: FakeHost, dram = false): void {
  const source = path.resolve('dist/src/energy/synthetic-source.js');
  const script = `
    import fs from 'node:fs';
    const { SyntheticEnergySource } = await import(${JSON.stringify(source)});
    const load = new SyntheticEnergySource({ procRoot: '/proc', cpus: [{ cpu: 0, pkg: 0 }, { cpu: 1, pkg: 0 }], start: 0 });
    const fds = ${JSON.stringify([0, 1].map((c) => fake.msrPath(c)))}.map((p) => fs.openSync(p, 'r+'));
    const b = Buffer.alloc(4);
    setInterval(() => {
      if (process.ppid !== ${process.pid}) process.exit(0);
      const raw = Number(load.read()[0].counter.raw);
      b.writeUInt32LE(raw >>> 0);
      for (const fd of fds) fs.writeSync(fd, b, 0, 4, ${MSR_PKG_ENERGY_STATUS});
      if (!${dram}) return;
      b.writeUInt32LE(Math.floor(raw / 5) >>> 0);
      for (const fd of fds) fs.writeSync(fd, b, 0, 4, ${MSR_DRAM_ENERGY_STATUS});
    }, 20);`;
  // Counting before the helper probes it (a register reading 0 is a domain the host does not have).
  if (dram) fake.setCounter([0, 1], MSR_DRAM_ENERGY_STATUS, 1);
  const group = testGroup('plpump');
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: 'ignore' });
  cleanups.push(() => child.kill('SIGKILL'));
  fs.writeFileSync(path.join(group, 'cgroup.procs'), `${child.pid}\n`);
}

const SOURCES = ['synthetic', 'fake MSR'] as const;

/**
 * The daemon under its keeper (interval 1 s, no discovery, a limits file with no limit yet) on the
 * synthetic source, or on the fake MSR device following the CPU load (loadFollowingMsr).
 */
async function limitDaemon(source: (typeof SOURCES)[number], dram = false): Promise<{ sock: string; h: DaemonChild; limitsFile: string }> {
  const fake = new FakeHost({ packages: [0, 0] });
  cleanups.push(() => fake.cleanup());
  fake.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 0 } });
  if (source === 'fake MSR') loadFollowingMsr(fake, dram);
  const dir = tempDir('vmsr-plimit-');
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  const sock = path.join(dir, 'helper.sock');
  const limitsFile = path.join(dir, 'limits');
  fs.writeFileSync(limitsFile, '# no limits yet\n');
  const energy = source === 'fake MSR' ? 'msr' : 'synthetic';
  const args = ['--keeper', '-k', sock, ...hostArgs(fake), '--energy-source', energy, '--interval', '1', '--no-discovery'];
  // The helper gets the shares the guests get: at a task's 1024 against their 32768, a guest let go of
  // its limit starved it (a restart's check of the binary took 9 s, its new image 10 s to serve).
  const helperGroup = testGroup('plhelper');
  const h = spawnHelper([...args, '--power-limits', limitsFile], { env: defaultKeeperEnv() });
  cleanups.push(() => h.stop('SIGKILL'));
  fs.writeFileSync(path.join(helperGroup, 'cgroup.procs'), `${h.proc.pid}\n`);
  await waitFor(() => listenings(h) > 0, 'the helper to listen', h);
  fs.writeFileSync(path.join(helperGroup, 'cgroup.procs'), `${servingPid(h.proc.pid!)}\n`);
  return { sock, h, limitsFile };
}

async function registered(
  c: Pick<V2Client, 'register' | 'subscribe'>,
  q: QemuGuest,
  dram?: PowerLog,
): Promise<{ vmId: number; log: PowerLog }> {
  const spec = await vmSpecFromQmp(q.qmpPath, '/proc');
  const { vmId } = await c.register({ pid: spec.pid, vcpus: spec.vcpus });
  const log = new PowerLog();
  await c.subscribe(vmId, (u) => (log.add(u), dram?.add(u)), undefined, { domains: dram !== undefined });
  await waitFor(() => log.points.length >= 2, `two intervals of ${q.name} measured`, undefined, 30_000);
  return { vmId, log };
}

/**
 * Deadline of one command line: far above what its own waits allow (reload: 61 s for the restart to
 * begin and 60 s for the new image to serve, src/cli/commands/reload.ts; the others a connect and a
 * reply), on a host whose CPUs the spinning guests share. It killed reloads at 30 s, while a daemon
 * starved by a guest just let go of its limit was still restarting, which read as "exit 1, no output".
 */
const CLI_DEADLINE_MS = 180_000;

/** Runs the command line: its exit code and output; one that outlives CLI_DEADLINE_MS or is ended by a signal is a failure that says so. */
function cli(args: string[], prefix: string[] = []): Promise<{ code: number; stdout: string; stderr: string }> {
  const cmd = [...prefix, process.execPath, BIN, ...args];
  const what = `vmsr-helper ${args.join(' ')}`;
  return new Promise((resolve, reject) =>
    execFile(cmd[0]!, cmd.slice(1), { timeout: CLI_DEADLINE_MS }, (e, stdout, stderr) => {
      if (e === null) return resolve({ code: 0, stdout, stderr });
      if (typeof e.code === 'number') return resolve({ code: e.code, stdout, stderr });
      const how = e.killed ? `did not end within ${CLI_DEADLINE_MS / 1000} s (killed by ${e.signal})` : `was ended by ${e.signal}`;
      reject(new Error(`${what} ${how}; it printed: ${JSON.stringify(stdout + stderr)}`));
    }),
  );
}

/** `vmsr-helper reload` of the helper `h`, which must end with 0 (else its output and the helper's last log lines say why). */
async function reloaded(h: DaemonChild, sock: string): Promise<void> {
  const r = await cli(['reload', '-k', sock]);
  const log = h.stderr().split('\n').slice(-30).join('\n');
  console.log(`reload: ${r.stdout.trim()}`);
  expect(r.code, `reload exited ${r.code}: ${JSON.stringify(r.stdout + r.stderr)}; the helper's last log lines:\n${log}`).toBe(0);
}

const cpuGroupOfTid = (pid: number, tid: number) => /^\d+:cpu:(.*)$/m.exec(fs.readFileSync(`/proc/${pid}/task/${tid}/cgroup`, 'utf8'))?.[1];

/** How far a 3-interval mean may be off the limit and still count as held. */
const BAND = 0.05;
/** How late a sample may come on a loaded host (timer slack, a busy event loop) without counting as an interval later. */
const SAMPLE_SLACK_S = 0.25;

/**
 * The figures of one limited stretch, from t0 (the limit set). On a host shared with other work the
 * package's power, and so the VM's share of it, moves under the loop (docs/power-limits.md "Accuracy"):
 * a disturbance is the host's, its correction the loop's. So: `settleS`, the time until the 3-interval
 * mean first comes within 5 % of the limit; `excursionS`, the longest stretch after that with it
 * outside 5 % (how long the loop takes to correct a disturbance); the mean error over the `holdS`
 * seconds from t0 + 5 s; the worst single interval; the overshoot of the step (the first 10 s: how far
 * power went past the limit on the far side, below it when coming down from `from`); and the 3-interval
 * means themselves, for the log.
 */
function figures(log: PowerLog, t0: number, limit: number, holdS: number, from = Infinity) {
  const after = log.points.filter((x) => x.t > t0 + 1.5);
  const avg3 = after.map((_, i) => (i < 2 ? NaN : (after[i]!.w + after[i - 1]!.w + after[i - 2]!.w) / 3));
  const inBand = (a: number) => Math.abs(a / limit - 1) <= BAND;
  const first = avg3.findIndex(inBand);
  const settleS = first < 0 ? Infinity : after[Math.max(0, first - 2)]!.t - t0;
  let excursionS = 0;
  for (let i = Math.max(first, 0), out = -1; first >= 0 && i < avg3.length; i++) {
    if (inBand(avg3[i]!)) out = -1;
    else if (out < 0) out = i;
    if (out >= 0) excursionS = Math.max(excursionS, after[i]!.t - after[out - 1]!.t);
  }
  const hold = log.points.filter((x) => x.t > t0 + 5 && x.t <= t0 + 5 + holdS);
  const mean = hold.reduce((sum, x) => sum + x.w, 0) / hold.length;
  const worst = Math.max(...hold.map((x) => Math.abs(x.w / limit - 1)));
  const step = after.filter((x) => x.t <= t0 + 10).map((x) => x.w);
  const overshoot = from > limit ? Math.max(0, 1 - Math.min(...step) / limit) : Math.max(0, Math.max(...step) / limit - 1);
  const means = avg3.filter((x) => !Number.isNaN(x)).map((x) => (x / limit).toFixed(2));
  return {
    settleS,
    excursionS,
    meanErr: mean / limit - 1,
    worstInterval: worst,
    overshoot,
    intervals: hold.length,
    means: means.join(' '),
  };
}

/**
 * The step's overshoot allowed: 10 % on KVM guests. Without /dev/kvm the guests run under TCG, whose vCPU
 * threads also translate code, so one interval after a step swings further (0.106 seen on the 2-core CI machine).
 */
const STEP_OVERSHOOT = hasKvm() ? 0.1 : 0.2;

/** Checks a stretch's figures: settled within 5 s, every disturbance corrected within 5 s, the mean within 5 %, the step's overshoot at most `overshoot`. */
function expectHeld(f: ReturnType<typeof figures>, overshoot = STEP_OVERSHOOT): void {
  // The samples come about 1 s apart: a loaded host's timer slack puts the fifth a few ms past 5 s.
  expect(f.settleS, 'the 3-interval mean within 5 % of the limit by 5 s').toBeLessThanOrEqual(5 + SAMPLE_SLACK_S);
  expect(f.excursionS, 'every stretch outside 5 % corrected within 5 s').toBeLessThanOrEqual(5 + SAMPLE_SLACK_S);
  expect(Math.abs(f.meanErr), 'the mean held within 5 %').toBeLessThanOrEqual(BAND);
  expect(f.overshoot, "the step's overshoot").toBeLessThanOrEqual(overshoot);
}

describe('power limits on real QEMU guests', () => {
  it('a VM limited to half its power settles within 5 s and holds within 5 % for 30 s; raised, lowered and removed, its quota comes back byte for byte; an observer is refused', async (ctx) => {
    const skip = why();
    if (skip) return ctx.skip(skip);
    const { sock } = await startOpenDaemon({
      packages: [0, 0],
      units: 0,
      extra: ['--energy-source', 'synthetic', '--interval', '1', '--no-discovery', '--observer-group', OBSERVER.name],
      onCleanup: (c) => cleanups.push(c),
    });
    // As libvirt or a systemd scope would: the VM in a group of its own, with a quota of 1.9 CPUs already set.
    const dir = testGroup('plvm1', '190000\n');
    const q = await spinningGuest('plvm1', 2, dir);
    const quotaFile = path.join(dir, 'cpu.cfs_quota_us');
    const before = fs.readFileSync(quotaFile);
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    const { vmId, log } = await registered(c, q);
    await until(log, log.now, 6, 'six intervals of unlimited power');
    const full = log.mean(log.now - 5, log.now);
    expect(full, `unlimited power (${JSON.stringify(log.points)})`).toBeGreaterThan(1);

    const limit = Math.round((full / 2) * 10) / 10;
    const t0 = log.now;
    const state = await c.limit(vmId, limit);
    expect(state.limitMw).toBe(Math.round(limit * 1000));
    await until(log, t0, 36, 'the limited VM over 36 s');
    const f = figures(log, t0, limit, 30);
    console.log(`power limit, one VM: unlimited ${full.toFixed(1)} W, limit ${limit} W:`, JSON.stringify(f));
    expectHeld(f);
    // The helper wrote its quota in the VM's own group, below the 1.9 CPUs set before it.
    const inForce = Number(fs.readFileSync(quotaFile, 'utf8'));
    expect(inForce).toBeLessThan(190000);
    expect((await c.limit(vmId)).quotaUs).toBe(inForce);
    // The VM's statistics file says the same: the limit (mW), the quota (thousandths of a CPU), the time limited (ms).
    const stats = StatsReader.open((await c.statsFd(vmId)).fd);
    cleanups.push(() => stats.close());
    const s = stats.read();
    expect(stats.value(s, 'power_limit')).toBe(BigInt(Math.round(limit * 1000)));
    expect(Number(stats.value(s, 'power_limit_cpu_quota'))).toBeGreaterThan(0);
    expect(Number(stats.value(s, 'power_limited_time'))).toBeGreaterThan(25_000);

    // An observer (uid nobody, in --observer-group) sees the VM but may not limit it.
    const nobody = ['setpriv', `--reuid=${NOBODY}`, `--regid=${NOBODY}`, `--groups=${OBSERVER.gid}`, '--'];
    if (which('setpriv')) {
      const r = await cli(['limit', String(q.pid), '10', '-k', sock], nobody);
      expect(r.code).toBe(1);
      expect(r.stderr).toContain("power limits are set by root and the helper's --socket-group");
      expect((await c.limit(vmId)).limitMw).toBe(Math.round(limit * 1000));
    }
    // The command line lists it (root).
    const listed = await cli(['limit', '-k', sock]);
    expect(listed.stdout).toMatch(
      new RegExp(`^"plvm1" pid ${q.pid}: package limit ${limit} W, quota \\d+ % of a CPU, limited \\d+ s$`, 'm'),
    );

    // Raised to 0.6 of the unlimited power, then lowered to 1/3: each holds as the first did, or, when
    // the host's other work leaves the VM under a raised limit, the helper lets go (nothing done to a VM
    // under its limit) and the VM stays under it.
    let previous = limit;
    for (const frac of [0.6, 1 / 3]) {
      const l = Math.round(full * frac * 10) / 10;
      const t = log.now;
      const r = await cli(['limit', 'plvm1', String(l), '-k', sock]);
      expect(r.code, r.stderr).toBe(0);
      await until(log, t, 16, `the VM limited to ${l} W over 16 s`);
      const g = figures(log, t, l, 10, previous);
      previous = l;
      console.log(`power limit, one VM, limit moved to ${l} W:`, JSON.stringify(g));
      expect(g.meanErr).toBeLessThanOrEqual(0.05);
      // Under a raised limit because the host's other work keeps it there, not the helper: let go, or
      // a quota the spinning VM no longer runs into (throttled in few periods; a quota holding it
      // under would throttle it in nearly every one).
      if (g.meanErr < -0.05 && (await c.limit(vmId)).quotaUs !== 0)
        expect(await throttledShare(dir, 3_000), 'under its limit only when its quota does not hold it there').toBeLessThan(0.25);
      expect(g.overshoot).toBeLessThanOrEqual(0.1);
    }
    // Removed: the quota file holds what it held before, byte for byte, and the power comes back.
    const off = await cli(['limit', 'plvm1', 'off', '-k', sock]);
    expect(off.code, off.stderr).toBe(0);
    expect(fs.readFileSync(quotaFile)).toEqual(before);
    const tOff = log.now;
    await until(log, tOff, 6, 'six intervals after the limit was removed');
    expect(log.mean(tOff + 2, tOff + 6)).toBeGreaterThan(full * 0.8);
    expect((await c.limit(vmId)).limitMw).toBe(0);
  }, 300_000);

  for (const source of SOURCES)
    it(`two VMs held at their own limits at the same time leave a third VM untouched, and nothing throttled once the VMs end (${source})`, async (ctx) => {
      const skip = why();
      if (skip) return ctx.skip(skip);
      const { sock } = await limitDaemon(source);
      // One vCPU each: three spinning guests on 2 host cores, in one group (as plain QEMUs started by
      // one service would be): the helper makes a group of its own for each VM it limits.
      const shared = testGroup('plvm-shared');
      const guests = [];
      for (const name of ['plvmA', 'plvmB', 'plvmC']) guests.push(await spinningGuest(name, 1, shared));
      const c = await V2Client.connect(sock);
      cleanups.push(() => c.close());
      const vms = [];
      for (const q of guests) vms.push(await registered(c, q));
      const [a, b, third] = vms as [(typeof vms)[0], (typeof vms)[0], (typeof vms)[0]];
      await until(a.log, a.log.now, 6, 'six intervals of unlimited power');
      const fullA = a.log.mean(a.log.now - 5, a.log.now);
      const fullB = b.log.mean(b.log.now - 5, b.log.now);
      const limitA = Math.round(fullA * 0.5 * 10) / 10;
      const limitB = Math.round(fullB * 0.7 * 10) / 10;
      const t0 = a.log.now;
      await Promise.all([c.limit(a.vmId, limitA), c.limit(b.vmId, limitB)]);
      await until(a.log, t0, 36, 'the two limited VMs over 36 s');
      const fa = figures(a.log, t0, limitA, 30);
      const fb = figures(b.log, t0, limitB, 30);
      console.log(`power limit (${source}), VM A of three: unlimited ${fullA.toFixed(1)} W, limit ${limitA} W:`, JSON.stringify(fa));
      console.log(`power limit (${source}), VM B of three: unlimited ${fullB.toFixed(1)} W, limit ${limitB} W:`, JSON.stringify(fb));
      for (const f of [fa, fb]) expectHeld(f);
      // The third has no limit: its threads stay in the group QEMU started them in, and nothing was made for it.
      const [qa, , qc] = guests as [QemuGuest, QemuGuest, QemuGuest];
      expect((await c.limit(third.vmId)).limitMw).toBe(0);
      const cTid = Number(fs.readdirSync(`/proc/${qc.pid}/task`).find((t) => Number(t) !== qc.pid) ?? qc.pid);
      expect(cpuGroupOfTid(qc.pid, cTid)).not.toContain('vmsr-helper-vm-');
      expect(fs.existsSync(path.join(shared, `vmsr-helper-vm-${qc.pid}`))).toBe(false);
      // A's threads shared a group with B and C: the helper made one for them, and removes it when A ends.
      const made = path.join(shared, `vmsr-helper-vm-${qa.pid}`);
      expect(cpuGroupOfTid(qa.pid, qa.pid)).not.toContain('vmsr-helper-vm-');
      expect(fs.existsSync(made)).toBe(true);
      await qa.stop();
      await waitFor(() => !fs.existsSync(made), 'the group made for A removed once A ended', undefined, 30_000);
      // B's client goes: its VM is released, its group removed and its threads back where they were.
      const madeB = path.join(shared, `vmsr-helper-vm-${guests[1]!.pid}`);
      expect(fs.existsSync(madeB)).toBe(true);
      await c.close();
      await waitFor(() => !fs.existsSync(madeB), "the group made for B removed once B's registration ended", undefined, 30_000);
      expect(cpuGroupOfTid(guests[1]!.pid, guests[1]!.pid)).toBe(`/${path.basename(shared)}`);
      expect(fs.existsSync(shared)).toBe(true);
    }, 300_000);

  it('on the fake MSR device following the CPU load, a limit holds across a crash of the serving process and a reload, is given back byte for byte when removed or when the helper stops, and the limits file sets one at the reload', async (ctx) => {
    const skip = why();
    if (skip) return ctx.skip(skip);
    const { sock, h, limitsFile } = await limitDaemon('fake MSR');

    const group = testGroup('plvmk', '190000\n');
    const q = await spinningGuest('plvmk', 2, group);
    const quotaFile = path.join(group, 'cpu.cfs_quota_us');
    const before = fs.readFileSync(quotaFile);
    const c = await ResumingV2Client.connect(sock);
    cleanups.push(() => c.close());
    const { vmId, log } = await registered(c, q);
    await until(log, log.now, 6, 'six intervals of unlimited power');
    const full = log.mean(log.now - 5, log.now);
    const limit = Math.round((full / 2) * 10) / 10;
    const t0 = log.now;
    // Over v2 (the command line's start alone takes seconds on this busy host: the settling is the helper's).
    await (await c.ready()).limit(vmId, limit);
    await until(log, t0, 36, 'the limited VM over 36 s');
    const f = figures(log, t0, limit, 30);
    console.log(`power limit on the fake MSR, one VM: unlimited ${full.toFixed(1)} W, limit ${limit} W:`, JSON.stringify(f));
    expectHeld(f);

    /** The limit goes on across what `restart` does: never given back meanwhile, held within 5 % over the 10 s after. */
    const holdsAcross = async (what: string, restart: () => unknown, l: number) => {
      const serving = listenings(h);
      const t = log.now;
      await restart();
      await waitFor(() => listenings(h) > serving, `the serving process after ${what}`, h, 60_000);
      expect(fs.readFileSync(quotaFile).equals(before), `the quota still in force after ${what}`).toBe(false);
      await until(log, t, 14, `14 s after ${what}`);
      const mean = log.mean(t + 4, t + 14);
      console.log(`power limit across ${what}: limit ${l} W, mean ${mean.toFixed(2)} W over the 10 s after`);
      expect(Math.abs(mean / l - 1), `held within 5 % after ${what}`).toBeLessThanOrEqual(0.05);
      expect((await cli(['limit', '-k', sock])).stdout).toMatch(
        new RegExp(`^"plvmk" pid ${q.pid}: package limit ${l} W, quota \\d+ %`, 'm'),
      );
    };
    // stats and watch show the limit and that it bites, in their tables and their JSON records.
    const statsJson = (await cli(['stats', '--once', '--json', '--vm', 'plvmk', '-k', sock])).stdout
      .split('\n')
      .filter((l) => l.includes('"type":"vm"'));
    expect(JSON.parse(statsJson[0]!)).toMatchObject({ name: 'plvmk', power_limit_w: limit, power_limit_state: 'throttled' });
    expect((await cli(['stats', '--once', '--vm', 'plvmk', '-k', sock])).stdout).toMatch(
      new RegExp(`plvmk .* live, package limit ${limit} W throttled \\(quota \\d+\\.\\d\\d CPU, \\d+ s limited\\)`),
    );
    const watched = await cli(['watch', 'plvmk', '--count', '2', '-k', sock]);
    expect(watched.stdout).toMatch(new RegExp(`  package limit ${limit} W throttled`));
    const watchedJson = (await cli(['watch', 'plvmk', '--count', '2', '--json', '-k', sock])).stdout
      .split('\n')
      .filter((l) => l.includes('"type":"update"'));
    expect(JSON.parse(watchedJson.at(-1)!)).toMatchObject({ power_limit_w: limit, power_limit_state: 'throttled' });

    await holdsAcross('a SIGKILL of the serving process', () => process.kill(servingPid(h.proc.pid!), 'SIGKILL'), limit);
    expect(h.stderr()).toMatch(/power limits taken up: 1 of 1/);
    await holdsAcross('a reload', () => reloaded(h, sock), limit);

    // Removed: the quota file holds what it held before, byte for byte.
    const off = await cli(['limit', 'plvmk', 'off', '-k', sock]);
    expect(off.code, off.stderr).toBe(0);
    expect(fs.readFileSync(quotaFile)).toEqual(before);
    // The limits file names the VM (and has a bad line, refused with its reason): read at the reload.
    const fileLimit = Math.round(full * 0.45 * 10) / 10;
    fs.writeFileSync(limitsFile, `plvmk ${fileLimit}\nplvmk-typo twelve\n`);
    const serving = listenings(h);
    await reloaded(h, sock);
    await waitFor(() => listenings(h) > serving, 'the serving process after the reload', h, 60_000);
    // From the new process's first sample, where the file's limit starts (the interval before it spans the restart).
    const n = log.points.length;
    await waitFor(() => log.points.length >= n + 2, 'two intervals after the reload', h, 60_000);
    const t1 = log.points[n]!.t;
    expect(h.stderr()).toContain(`cannot read line 2 of the limits file ${limitsFile}: \\"twelve\\" is not a number of watts above 0`);
    await until(log, t1, 16, 'the VM limited by the file over 16 s');
    const g = figures(log, t1, fileLimit, 10);
    console.log(`power limit from the limits file: limit ${fileLimit} W:`, JSON.stringify(g));
    // The new process starts from the limit the file set: the step is the reload's, not measured.
    expectHeld(g, Infinity);
    // The helper stops: every quota goes back as it found it.
    expect(fs.readFileSync(quotaFile).equals(before)).toBe(false);
    await c.close();
    expect(await h.stop('SIGTERM')).toBe(0);
    expect(fs.readFileSync(quotaFile)).toEqual(before);
  }, 400_000);

  it("on the fake MSR device whose DRAM counter follows the load too, a limit on the VM's DRAM power holds it there beside a package limit it undercuts, and a domain the helper does not attribute is refused", async (ctx) => {
    const skip = why();
    if (skip) return ctx.skip(skip);
    const { sock } = await limitDaemon('fake MSR', true);
    const group = testGroup('plvmd', '-1\n');
    const q = await spinningGuest('plvmd', 2, group);
    const quotaFile = path.join(group, 'cpu.cfs_quota_us');
    const before = fs.readFileSync(quotaFile);
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    const dram = new PowerLog('dram');
    const { vmId, log } = await registered(c, q, dram);
    await until(dram, dram.now, 6, 'six intervals of unlimited DRAM power');
    const [fullDram, fullPkg] = [dram.mean(dram.now - 5, dram.now), log.mean(log.now - 5, log.now)];
    expect(fullDram, `unlimited DRAM power (${JSON.stringify(dram.points)})`).toBeGreaterThan(0.1);
    // The package limit at 80 % of its power, the DRAM limit at half of its: the DRAM one asks the lower quota.
    const [limitPkg, limitDram] = [Math.round(fullPkg * 0.8 * 10) / 10, Math.round(fullDram * 0.5 * 100) / 100];
    expect((await cli(['limit', 'plvmd', String(limitPkg), '-k', sock])).code).toBe(0);
    const set = await cli(['limit', 'plvmd', String(limitDram), '--domain', 'dram', '-k', sock]);
    // From the last interval before the command returned (the limit was set by its reply, just before):
    // its start, seconds on this busy host, is not the helper's settling (it put the first 6 s of the
    // hold window under the package limit alone, 60 % over the DRAM one, at load average 17).
    const t0 = dram.now;
    expect(set.stdout).toMatch(new RegExp(`^"plvmd" pid ${q.pid}: dram limit ${limitDram} W, `, 'm'));
    await until(dram, t0, 36, 'the DRAM-limited VM over 36 s');
    const f = figures(dram, t0, limitDram, 30);
    const pkgHeld = log.mean(t0 + 5, t0 + 35);
    console.log(
      `power limit on DRAM (fake MSR): unlimited ${fullDram.toFixed(2)} W DRAM / ${fullPkg.toFixed(1)} W package, limits ${limitDram} W DRAM / ${limitPkg} W package, package held at ${pkgHeld.toFixed(1)} W:`,
      JSON.stringify(f),
    );
    expectHeld(f);
    expect(pkgHeld).toBeLessThan(limitPkg * 0.95);
    expect(await c.limit(vmId, undefined, 'dram')).toMatchObject({ domain: 'dram', limitMw: Math.round(limitDram * 1000) });
    // The listing, stats, the statistics file name each limit with its domain.
    const listed = (await cli(['limit', '-k', sock])).stdout;
    expect(listed).toMatch(new RegExp(`^"plvmd" pid ${q.pid}: package limit ${limitPkg} W, quota \\d+ %`, 'm'));
    expect(listed).toMatch(new RegExp(`^"plvmd" pid ${q.pid}: dram limit ${limitDram} W, quota \\d+ %`, 'm'));
    expect((await cli(['stats', '--once', '--vm', 'plvmd', '-k', sock])).stdout).toMatch(
      new RegExp(`plvmd .* live, package limit ${limitPkg} W, dram limit ${limitDram} W throttled`),
    );
    const stats = StatsReader.open((await c.statsFd(vmId)).fd);
    cleanups.push(() => stats.close());
    expect(stats.value(stats.read(), 'dram_power_limit')).toBe(BigInt(Math.round(limitDram * 1000)));
    // psys is not read on this host: refused with the domains it attributes.
    const psys = await cli(['limit', 'plvmd', '5', '--domain', 'psys', '-k', sock]);
    expect(psys.code).toBe(1);
    expect(psys.stderr).toContain(
      `cannot limit the psys power of VM ${vmId}: this host's helper does not attribute psys power (it attributes package, dram); limit one of those`,
    );
    // Both removed: the quota file holds what it held before, byte for byte.
    expect((await cli(['limit', 'plvmd', 'off', '--domain', 'dram', '-k', sock])).code).toBe(0);
    expect((await c.limit(vmId)).limitMw).toBe(Math.round(limitPkg * 1000));
    expect((await cli(['limit', 'plvmd', 'off', '-k', sock])).code).toBe(0);
    expect(fs.readFileSync(quotaFile)).toEqual(before);
  }, 300_000);
});
