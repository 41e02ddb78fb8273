/**
 * Crashes under the keeper (`vmsr-helper --keeper`, docs/daemon.md "Crashes"), real parts only: the
 * built daemon and its keeper, SIGKILL, real Unix sockets, a QEMU-like legacy client (one connection,
 * never reconnecting) and a v2 client (ResumingV2Client) with a registered busy process; the fake is
 * the MSR file of FakeHost, its package counter pumped.
 *
 * - The serving process killed twice, 5 s apart: the QEMU-like connection stays open and is served by
 *   the next process, its counter never goes back; the v2 client's totals go on from the checkpoint,
 *   never back, never more than the package's energy meanwhile. The time from the kill to the first
 *   answer is printed against the 1 s goal.
 * - A checkpoint that crashes the process restoring it (the test hook CRASH_ON_VM_PID_ENV) is not
 *   passed on: the next process starts fresh and says why; the connection is still served.
 * - SIGKILLs from outside (the -u user may send them) never stop the keeper; crashes in a row (starts that fail)
 *   do: the keeper backs off and stops after KEEPER_LIMITS.maxCrashesInARow, saying why,
 *   and removes the socket file.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { FakeHost } from '../support/fake-host.js';
import { EnergyPump } from '../support/energy-pump.js';
import {
  BIN,
  defaultKeeperEnv,
  ensureBuilt,
  hostArgs,
  LegacyClient,
  servingPid,
  spawnHelper,
  startHelper,
  tempDir,
  waitFor,
  type DaemonChild,
} from '../daemon/support/daemon-process.js';
import { pollFor, processEnded } from '../support/wait.js';
import { ResumingV2Client } from '../../src/client/resuming-client.js';
import { CRASH_ON_VM_PID_ENV } from '../../src/helper/handover/kept.js';
import { KEEPER_LIMITS } from '../../src/keeper/keeper.js';

const cleanups: (() => Promise<unknown> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** ESU of 0x606 = 0xa1003: 2^-16 J per counter unit. */
const UJ_PER_UNIT = 1e6 / 65536;
const RATE = 60_000;
/** The goal: serving again this soon after the kill (printed, not asserted: a matter of timing). */
const GOAL_MS = 1000;

function fakeHost(): { host: FakeHost; pump: EnergyPump } {
  const host = new FakeHost({ packages: [0, 0], online: [0, 1] });
  host.writePackageMsr(0, 0x606, 0xa1003n);
  const pump = new EnergyPump(host, { msr: 0x611, start: 0x1000, unitsPerSecond: RATE });
  pump.start();
  cleanups.push(() => (pump.stop(), host.cleanup()));
  return { host, pump };
}

/** A process that keeps a thread busy part of the time (a VM's vCPU, to the helper). */
function busyProcess(): ChildProcess {
  const p = spawn(process.execPath, ['-e', 'setInterval(() => { const t = Date.now(); while (Date.now() - t < 20); }, 50)'], {
    stdio: 'ignore',
  });
  cleanups.push(() => void p.kill('SIGKILL'));
  return p;
}

const count = (h: DaemonChild, needle: string) => h.stderr().split(needle).length - 1;

async function startKeeper(dir: string, host: FakeHost, env: NodeJS.ProcessEnv = process.env): Promise<{ h: DaemonChild; sock: string }> {
  const sock = path.join(dir, 'helper.sock');
  const h = await startHelper(['--keeper', '-k', sock, ...hostArgs(host), '--interval', '0.2'], { env });
  cleanups.push(() => h.stop());
  return { h, sock };
}

/** SIGKILLs the serving process; resolves with the ms until `client` is answered again, and the answer. */
async function killAndServe(h: DaemonChild, client: LegacyClient): Promise<{ ms: number; value: bigint; pid: number }> {
  const pid = servingPid(h.proc.pid!);
  const recovered = count(h, 'recovered from a crash');
  const t0 = performance.now();
  process.kill(pid, 'SIGKILL');
  // QEMU's request waits (it sets no timeout) until the next serving process answers it.
  await waitFor(() => processEnded(pid), 'the kill', h, 5000);
  const value = await client.request(0x611, 0, process.pid).catch((e) => {
    throw new Error(`${(e as Error).message}\n${h.stderr()}`);
  });
  const ms = performance.now() - t0;
  await waitFor(() => count(h, 'recovered from a crash') > recovered, 'the new process to log its recovery', h, 30_000);
  expect(servingPid(h.proc.pid!), 'another serving process').not.toBe(pid);
  return { ms, value, pid };
}

describe('the keeper', () => {
  test('keeps the QEMU-like connection across two SIGKILLs 5 s apart; a v2 client resumes from the checkpoint, never back and never past the package energy', async () => {
    const { host } = fakeHost();
    const { h, sock } = await startKeeper(tempDir('vmsr-keeper-'), host);
    const qemu = await LegacyClient.connect(sock);
    cleanups.push(() => qemu.close());
    const vm = busyProcess();
    const v2 = await ResumingV2Client.connect(sock);
    cleanups.push(() => v2.close());
    const { vmId } = await v2.register({ pid: vm.pid!, vcpus: [{ tid: vm.pid!, vpkg: 0 }] });
    await pollFor(
      async () => ((await (await v2.ready()).read(vmId, 0)).energyUj > 0n ? true : undefined),
      'the VM to be paid energy',
      h.stderr,
    );

    let last = await qemu.request(0x611, 0, process.pid);
    const serving: number[] = [];
    for (let i = 0; i < 2; i++) {
      await new Promise((r) => setTimeout(r, 5000));
      // The package counter first, then a sample taken after it: that sample's counter is at least
      // pkgBefore, so the VM's energy from it on is bounded by the package energy from pkgBefore on.
      const pkgBefore = await qemu.request(0x611, 0, process.pid);
      const seen = await (await v2.ready()).read(vmId, 0);
      const before = await pollFor(
        async () => {
          const v = await (await v2.ready()).read(vmId, 0);
          return v.tNs > seen.tNs ? v : undefined;
        },
        `a sample after the package counter was read (kill ${i + 1})`,
        h.stderr,
      );
      const { ms, value } = await killAndServe(h, qemu);
      serving.push(ms);
      expect(value, `the counter never goes back (kill ${i + 1})`).toBeGreaterThanOrEqual(last);
      last = value;
      // The v2 client reconnects and REGISTERs again: the same vm_id, totals from the checkpoint on.
      const after = await pollFor(
        async () => {
          try {
            const v = await (await v2.ready()).read(vmId, 0);
            return v.tNs > before.tNs ? v : undefined;
          } catch {
            return undefined;
          }
        },
        `the v2 client to read its VM again after kill ${i + 1}`,
        h.stderr,
      );
      const pkgAfter = await qemu.request(0x611, 0, process.pid);
      const pkgUj = Number(pkgAfter - pkgBefore) * UJ_PER_UNIT;
      expect(after.energyUj, `the v2 total never goes back (kill ${i + 1})`).toBeGreaterThanOrEqual(before.energyUj);
      expect(Number(after.energyUj - before.energyUj), 'nor jumps past the package energy meanwhile').toBeLessThanOrEqual(pkgUj + 1);
    }
    console.log(
      `keeper: serving again after a SIGKILL in ${serving.map((x) => Math.round(x)).join(', ')} ms (goal under ${GOAL_MS} ms: ${Math.max(...serving) < GOAL_MS ? 'met' : 'NOT met'})`,
    );
    expect(qemu.closed, 'the QEMU-like connection stayed open').toBe(false);
    expect(h.stderr()).toMatch(
      /"msg":"recovered from a crash: the serving process \(pid \d+\) was ended by SIGKILL from another process \(not counted as a crash\); 1 QEMU connections kept; state restored from the checkpoint/,
    );
    // A stop on purpose stops the keeper too, and the socket file goes with it.
    expect(await h.stop('SIGTERM')).toBe(0);
    expect(fs.existsSync(sock)).toBe(false);
  }, 120_000);

  test('a checkpoint that crashes the process restoring it is not passed on: the next one starts fresh, says why, and serves the connection', async () => {
    const { host } = fakeHost();
    const vm = busyProcess();
    const { h, sock } = await startKeeper(tempDir('vmsr-keeper-'), host, { ...process.env, [CRASH_ON_VM_PID_ENV]: String(vm.pid) });
    const qemu = await LegacyClient.connect(sock);
    cleanups.push(() => qemu.close());
    const v2 = await ResumingV2Client.connect(sock);
    cleanups.push(() => v2.close());
    const { vmId } = await v2.register({ pid: vm.pid!, vcpus: [{ tid: vm.pid!, vpkg: 0 }] });
    await pollFor(
      async () => ((await (await v2.ready()).read(vmId, 0)).energyUj > 0n ? true : undefined),
      'the VM to be paid energy (and checkpointed)',
      h.stderr,
    );
    const before = await qemu.request(0x611, 0, process.pid);
    process.kill(servingPid(h.proc.pid!), 'SIGKILL');
    // The next process crashes restoring the checkpoint (SIGABRT); the one after starts without it.
    await waitFor(() => /died \(SIGABRT\)/.test(h.stderr()), 'the restore to crash', h, 30_000);
    const value = await qemu.request(0x611, 0, process.pid);
    expect(value).toBeGreaterThanOrEqual(before);
    await waitFor(() => count(h, 'recovered from a crash') >= 2, 'the fresh start', h, 30_000);
    const lines = h
      .stderr()
      .split('\n')
      .filter((l) => l.includes('recovered from a crash'));
    expect(lines[1]).toMatch(
      /crash 1 in a row.*no checkpoint restored \(the serving process \(pid \d+\) it was passed to died \(SIGABRT\) before it wrote one of its own/,
    );
    expect(qemu.closed).toBe(false);
    expect(h.proc.exitCode, 'the keeper runs on').toBeNull();
  }, 120_000);

  test('a restart in place (SIGHUP to the keeper, passed on) keeps the link to the keeper: a crash after it is recovered as before', async () => {
    const { host } = fakeHost();
    const { h, sock } = await startKeeper(tempDir('vmsr-keeper-'), host);
    const qemu = await LegacyClient.connect(sock);
    cleanups.push(() => qemu.close());
    await qemu.request(0x611, 0, process.pid);
    const pid = servingPid(h.proc.pid!);
    h.proc.kill('SIGHUP');
    await waitFor(() => count(h, '"msg":"handed over:') > 0, 'the restart in place', h, 30_000);
    expect(servingPid(h.proc.pid!), 'the same process, executed again').toBe(pid);
    await qemu.request(0x611, 0, process.pid);
    await killAndServe(h, qemu);
    expect(h.stderr()).not.toContain('the keeper is gone');
    expect(h.stderr()).toMatch(/recovered from a crash: [^"]*1 QEMU connections kept; state restored from the checkpoint/);
  }, 120_000);

  test('with -d the background process is the keeper, named by the pidfile: ready once its serving process is; a crash restarts it; SIGTERM to the keeper stops both and removes the pidfile', async () => {
    ensureBuilt();
    const { host } = fakeHost();
    const dir = tempDir('vmsr-keeper-');
    const [sock, pidfile, logFile] = ['h.sock', 'h.pid', 'h.log'].map((f) => path.join(dir, f)) as [string, string, string];
    // The foreground exits 0 once the background helper serves.
    execFileSync(process.execPath, [BIN, '--keeper', '-d', '-k', sock, '-f', pidfile, '--log-file', logFile, ...hostArgs(host)], {
      timeout: 60_000,
    });
    const keeper = Number(fs.readFileSync(pidfile, 'utf8'));
    const serving = servingPid(keeper);
    cleanups.push(() => void (fs.existsSync(`/proc/${keeper}`) && process.kill(keeper, 'SIGKILL')));
    expect(fs.readFileSync(`/proc/${keeper}/cmdline`, 'utf8')).toContain('--keeper');
    const qemu = await LegacyClient.connect(sock);
    cleanups.push(() => qemu.close());
    await qemu.request(0x611, 0, process.pid);
    process.kill(serving, 'SIGKILL');
    await qemu.request(0x611, 0, process.pid);
    const log = () => fs.readFileSync(logFile, 'utf8');
    const watched = { proc: { exitCode: null } as ChildProcess, stderr: log };
    await waitFor(() => /recovered from a crash/.test(log()), 'the next serving process', watched, 10_000);
    expect(Number(fs.readFileSync(pidfile, 'utf8')), 'the pidfile names the keeper still').toBe(keeper);
    process.kill(keeper, 'SIGTERM');
    await waitFor(() => !fs.existsSync(`/proc/${keeper}`), 'the keeper to stop', watched, 10_000);
    expect(fs.existsSync(sock)).toBe(false);
    expect(fs.existsSync(pidfile)).toBe(false);
    expect(log()).toMatch(/recovered from a crash: [^"]*1 QEMU connections kept/);
  }, 120_000);

  test(`SIGKILLs from outside never stop it (backed off); ${KEEPER_LIMITS.maxCrashesInARow} crashes in a row (starts that fail) do, saying why, and the socket file goes`, async () => {
    const { host } = fakeHost();
    const { h, sock } = await startKeeper(tempDir('vmsr-keeper-'), host);
    const qemu = await LegacyClient.connect(sock);
    cleanups.push(() => qemu.close());
    await qemu.request(0x611, 0, process.pid);
    const kill = async (last: boolean) => {
      const ready = count(h, '"msg":"Listening on');
      process.kill(servingPid(h.proc.pid!), 'SIGKILL');
      if (!last) await waitFor(() => count(h, '"msg":"Listening on') > ready, 'the start after a SIGKILL', h, 30_000);
    };
    // The -u user may SIGKILL the serving process (its own uid): one more than the crash limit.
    for (let i = 0; i < KEEPER_LIMITS.maxCrashesInARow; i++) await kill(false);
    expect(h.proc.exitCode, 'the keeper runs on after SIGKILLs from outside').toBeNull();
    expect(await qemu.request(0x611, 0, process.pid)).toBeGreaterThan(0n);
    // Crashes of its own (a sent SIGABRT or fault is ignored: test/hostile/sent-faults-end-no-service.test.ts):
    // the host's CPUs gone, every start after the last SIGKILL fails (an exit code), in a row.
    const sysRoot = host.cliArgs()[host.cliArgs().indexOf('--sys-root') + 1]!;
    fs.renameSync(sysRoot, `${sysRoot}.gone`);
    cleanups.push(() => {
      if (fs.existsSync(`${sysRoot}.gone`)) fs.renameSync(`${sysRoot}.gone`, sysRoot);
    });
    await kill(true);
    expect(await h.exited).toBe(1);
    expect(h.stderr()).toMatch(
      new RegExp(
        `the serving process died ${KEEPER_LIMITS.maxCrashesInARow} times in a row \\(the last: exit code \\d+\\): the keeper stops`,
      ),
    );
    // It backed off: each wait before a restart as KEEPER_LIMITS.backoffMs says, kills and crashes each in their row.
    const waits = [...h.stderr().matchAll(/"restartInMs":(\d+)/g)].map((m) => Number(m[1]));
    const row = (n: number) =>
      Array.from({ length: n }, (_, i) => KEEPER_LIMITS.backoffMs[Math.min(i, KEEPER_LIMITS.backoffMs.length - 1)]);
    expect(waits).toEqual([...row(KEEPER_LIMITS.maxCrashesInARow + 1), ...row(KEEPER_LIMITS.maxCrashesInARow - 1)]);
    // Each of its lines names each key once (the keeper's pid, the serving process's servingPid): JSON with a key twice is ambiguous.
    for (const line of h
      .stderr()
      .split('\n')
      .filter((l) => l.includes('keeper: the serving process died'))) {
      expect(line.match(/"pid":/g), line).toHaveLength(1);
      expect(JSON.parse(line), line).toHaveProperty('servingPid');
    }
    await qemu.whenClosed(5000);
    expect(fs.existsSync(sock)).toBe(false);
  }, 180_000);

  test('the keeper and its serving process together stay at most 45 MB PSS when idle (the keeper loads only itself)', async () => {
    const { host } = fakeHost();
    const { h } = await startKeeper(tempDir('vmsr-keeper-'), host);
    await waitFor(() => count(h, 'memory given back after start-up') > 0, 'the serving process to settle its memory', h, 30_000);
    const pss = (pid: number) => Number(/^Pss:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'))![1]) / 1024;
    const keeper = pss(h.proc.pid!);
    const serving = pss(servingPid(h.proc.pid!));
    console.log(
      `keeper PSS ${keeper.toFixed(1)} MB, serving process PSS ${serving.toFixed(1)} MB, together ${(keeper + serving).toFixed(1)} MB`,
    );
    expect(keeper + serving).toBeLessThanOrEqual(45);
  }, 60_000);

  test('the helper started alone runs under its keeper by default; --no-keeper and VMSR_HELPER_NO_KEEPER run it without one', async () => {
    const { host } = fakeHost();
    const dir = tempDir('vmsr-keeper-');
    const start = async (name: string, extra: string[], env: NodeJS.ProcessEnv) => {
      const h = await startHelper([...extra, '-k', path.join(dir, name), ...hostArgs(host), '--interval', '0.2'], { env });
      cleanups.push(() => h.stop());
      return h;
    };
    const children = (pid: number) => fs.readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim();
    const byDefault = await start('default.sock', [], defaultKeeperEnv());
    expect(byDefault.stderr()).toContain('keeper: holding the socket and the connections');
    const qemu = await LegacyClient.connect(path.join(dir, 'default.sock'));
    cleanups.push(() => qemu.close());
    await qemu.request(0x611, 0, process.pid);
    const { pid } = await killAndServe(byDefault, qemu);
    expect(pid).not.toBe(byDefault.proc.pid);
    const flag = await start('flag.sock', ['--no-keeper'], defaultKeeperEnv());
    const variable = await start('env.sock', [], { ...defaultKeeperEnv(), VMSR_HELPER_NO_KEEPER: '1' });
    for (const h of [flag, variable]) {
      expect(children(h.proc.pid!), 'no serving child: the process started serves').toBe('');
      expect(h.stderr()).not.toContain('keeper:');
    }
  }, 120_000);

  test('a SIGHUP to the keeper before its serving process is ready is passed on once it is: one restart in place, nothing ended', async () => {
    const { host } = fakeHost();
    const dir = tempDir('vmsr-keeper-');
    const sock = path.join(dir, 'helper.sock');
    const h = spawnHelper(['--keeper', '-k', sock, ...hostArgs(host), '--interval', '0.2']);
    cleanups.push(() => h.stop());
    // The keeper listens for signals before it starts its child: a child means the SIGHUP is the keeper's to take.
    const kids = `/proc/${h.proc.pid}/task/${h.proc.pid}/children`;
    await waitFor(
      () => fs.existsSync(kids) && fs.readFileSync(kids, 'utf8').trim() !== '',
      'the keeper to start its serving process',
      h,
      30_000,
    );
    const serving = servingPid(h.proc.pid!);
    h.proc.kill('SIGHUP');
    await waitFor(
      () => count(h, '"msg":"handed over:') > 0,
      'the restart in place the SIGHUP asked for, once the serving process is ready',
      h,
      60_000,
    );
    expect(servingPid(h.proc.pid!), 'the same serving process, executed again').toBe(serving);
    expect(h.stderr()).not.toContain('ended by a SIGHUP');
    expect(h.stderr()).not.toContain('recovered from a crash');
    const qemu = await LegacyClient.connect(sock);
    cleanups.push(() => qemu.close());
    await qemu.request(0x611, 0, process.pid);
  }, 120_000);
});
