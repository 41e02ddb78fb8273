/**
 * Any process of -u's user may signal the serving process: five SIGKILLs in a row once made the
 * keeper stop (now they are restarts, never counted: test/crash/keeper.daemon.test.ts), and five
 * `kill -SEGV` still did, since a fault's signal is counted as a crash. The serving process now
 * ignores the signals of a fault that another process sends (a real fault is forced by the kernel,
 * which puts the default action back, and still ends it). Here uid nobody sends each of them, five
 * times over, to the real daemon's serving process (-u nobody, its keeper): nothing dies, nothing is
 * restarted, and QEMU's connection is answered. SIGABRT too (it counted as a crash until the third
 * round: five `kill -ABRT` stopped the keeper): the process's own abort() still ends it with it (below).
 * And since every process of that user can still
 * stop the service (SIGTERM), the start says when the user runs other processes than the helper's.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { ensureBuilt, LegacyClient, servingPid } from '../daemon/support/daemon-process.js';
import { killAs, logLines, NOBODY, notRoot, onCleanup, sleep, startDaemonOpenToAll } from './support.js';

const why = notRoot();
/** The built watchdog module the serving process runs (its ignoreSentFaults). */
const WATCHDOG = path.resolve('dist/src/helper/lifecycle/loop-watchdog.js');
const FAULTS = ['SEGV', 'BUS', 'ILL', 'FPE', 'TRAP', 'SYS', 'ABRT'] as const;
const ROUNDS = 5;

/** The signals `pid` ignores (SigIgn of /proc/PID/status). */
function ignored(pid: number): bigint {
  return BigInt(`0x${/^SigIgn:\s*([0-9a-f]+)/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))![1]}`);
}

describe.skipIf(why !== null)('fault signals sent by the -u user', () => {
  if (why !== null) console.log(`skipped: ${why}`);

  test(`${ROUNDS} rounds of ${FAULTS.join(', ')} from -u's user end no serving process and stop no keeper`, async () => {
    const { daemon, sock } = await startDaemonOpenToAll(['--keeper']);
    const keeper = daemon.proc.pid!;
    const qemu = await LegacyClient.connect(sock);
    onCleanup(() => qemu.close());
    expect(await qemu.request(0x606, 0, process.pid)).toBe(0xa1003n);
    const serving = servingPid(keeper);
    // It said "Listening on" (startDaemonOpenToAll waited for it) in the call that then ignores them.
    const mask = FAULTS.reduce((m, s) => m | (1n << BigInt(os.constants.signals[`SIG${s}`] - 1)), 0n);
    console.log(`SigIgn of the serving process: ${ignored(serving).toString(16)} (the faults: ${mask.toString(16)})`);
    for (let round = 0; round < ROUNDS; round++)
      for (const sig of FAULTS) expect(await killAs(NOBODY, sig, serving), `kill -${sig} as nobody`).toBe(0);
    // Waited for: a death would have been seen by now (the keeper restarts at once after the first).
    await sleep(1_000);
    expect(servingPid(keeper), 'the same serving process').toBe(serving);
    expect(daemon.stderr()).not.toContain('keeper: the serving process');
    expect(await qemu.request(0x606, 0, process.pid), 'QEMU is answered on its connection').toBe(0xa1003n);
    expect(daemon.proc.exitCode).toBeNull();
  }, 120_000);

  test('an abort of its own still ends a process that ignores the fault signals sent to it, with SIGABRT', async () => {
    ensureBuilt();
    // ignoreSentFaults as the serving process calls it, then a SIGABRT sent to itself (ignored), then process.abort() (Node's fatal path).
    const code = `import { ignoreSentFaults } from ${JSON.stringify(WATCHDOG)};
      ignoreSentFaults();
      process.kill(process.pid, 'SIGABRT');
      setTimeout(() => { console.log('alive after a sent SIGABRT'); process.abort(); }, 200);`;
    const p = spawn(process.execPath, ['--input-type=module', '-e', code], { stdio: ['ignore', 'pipe', 'ignore'] });
    let out = '';
    p.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    const [, signal] = await new Promise<[number | null, string | null]>((r) => p.on('exit', (c, s) => r([c, s])));
    expect(out).toContain('alive after a sent SIGABRT');
    expect(signal).toBe('SIGABRT');
  }, 60_000);

  test('the start says so when other processes share the helper’s user, naming one', async () => {
    const other = spawn('sleep', ['60'], { uid: NOBODY, gid: NOBODY, stdio: 'ignore' });
    onCleanup(() => void other.kill('SIGKILL'));
    const { daemon } = await startDaemonOpenToAll(['--keeper']);
    const line = logLines(daemon.stderr()).find((l) => typeof l.msg === 'string' && l.msg.startsWith("the helper's user (uid 65534) runs"));
    expect(line, 'the warning').toBeDefined();
    expect(line!.processes as number).toBeGreaterThanOrEqual(1);
    expect(line!.msg).toContain('give the helper a user of its own');
  }, 60_000);
});
