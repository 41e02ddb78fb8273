/**
 * SIGHUP across the daemon's exec (os/sighup-hold.ts, ignoreSignal in os/libc/processes.ts): what the kernel
 * and Node do with it, checked on real processes, and the hold's count. The restart itself is
 * attacked in test/hostile/sighup-bursts-kill-no-helper.test.ts.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { ignoreSignal, restoreSignalAction } from '../../src/os/libc/processes.js';
import { SIGHUP_HELD_ENV } from '../../src/os/sighup-hold.js';
import { ensureBuilt, ROOT } from '../daemon/support/daemon-process.js';
import { RestartRequests } from '../../src/helper/handover/restarter.js';

const SIGHUP_BIT = 1n; // bit (SIGHUP - 1) of SigIgn

function sigIgn(status: string): bigint {
  const m = /^SigIgn:\s*([0-9a-f]+)$/m.exec(status);
  if (!m) throw new Error('no SigIgn line in /proc/PID/status');
  return BigInt(`0x${m[1]}`);
}

function run(cmd: string, args: string[], env: NodeJS.ProcessEnv = process.env): Promise<string> {
  return new Promise((resolve, reject) =>
    execFile(cmd, args, { env }, (err, out, errOut) => (err ? reject(new Error(`${cmd} failed: ${err.message} ${errOut}`)) : resolve(out))),
  );
}

describe('SIGHUP across an exec', () => {
  it('ignoreSignal makes SIGHUP ignored for the kernel, and restoreSignalAction puts the previous action back', () => {
    const before = sigIgn(fs.readFileSync('/proc/self/status', 'utf8'));
    const old = ignoreSignal(1);
    try {
      expect(sigIgn(fs.readFileSync('/proc/self/status', 'utf8')) & SIGHUP_BIT).toBe(SIGHUP_BIT);
    } finally {
      restoreSignalAction(1, old);
    }
    expect(sigIgn(fs.readFileSync('/proc/self/status', 'utf8'))).toBe(before);
  });

  it("an inherited SIG_IGN survives execve but Node's start-up resets it: SIGHUP must be held from the first module", async () => {
    const probe = "process.stdout.write(require('fs').readFileSync('/proc/self/status','utf8'))";
    // sh's own status after `trap '' HUP` (the kernel keeps it across exec into cat) and node's.
    const shell = await run('sh', ['-c', `trap '' HUP; exec cat /proc/self/status`]);
    expect(sigIgn(shell) & SIGHUP_BIT).toBe(SIGHUP_BIT);
    const node = await run('sh', ['-c', `trap '' HUP; exec "${process.execPath}" -e "${probe}"`]);
    expect(sigIgn(node) & SIGHUP_BIT).toBe(0n);
  });

  it('an image the daemon executed holds SIGHUP from its first module, and the handler taking over says how many it held', async () => {
    ensureBuilt();
    const hold = path.join(ROOT, 'dist/src/os/sighup-hold.js');
    const script = `
      const h = await import(${JSON.stringify(hold)});
      const holds = h.holdSighupAfterExec();
      for (let i = 0; i < 3; i++) { process.kill(process.pid, 'SIGHUP'); await new Promise((r) => setTimeout(r, 50)); }
      process.on('SIGHUP', () => {});
      process.stdout.write(JSON.stringify({ holds, held: h.releaseSighupHold(), marker: process.env.${SIGHUP_HELD_ENV} ?? null }));`;
    const out = await run(process.execPath, ['--input-type=module', '-e', script], { ...process.env, [SIGHUP_HELD_ENV]: '1' });
    expect(JSON.parse(out)).toEqual({ holds: true, held: 3, marker: null });
    // Without the marker (any other command, a first start) nothing is held: SIGHUP keeps its default.
    const plain = await run(process.execPath, [
      '--input-type=module',
      '-e',
      `const h = await import(${JSON.stringify(hold)}); process.stdout.write(String(h.holdSighupAfterExec()));`,
    ]);
    expect(plain).toBe('false');
  });
});

describe('RestartRequests', () => {
  it('quiet() resolves once no restart was asked for the quiet time, counting the ones asked meanwhile', async () => {
    const r = new RestartRequests();
    expect(r.ask()).toBe(true);
    const t0 = performance.now();
    const asked = setInterval(() => expect(r.ask()).toBe(false), 20);
    setTimeout(() => clearInterval(asked), 200);
    const meanwhile = await r.quiet(100);
    // The last ask came at about 200 ms; quiet waited 100 ms past it, whatever the timers' lateness.
    expect(performance.now() - t0).toBeGreaterThanOrEqual(280);
    expect(meanwhile).toBeGreaterThanOrEqual(5);
    r.done();
    expect(r.ask()).toBe(true);
    expect(await r.quiet(10)).toBe(0);
  });
});
