/**
 * Crashes under systemd (docs/daemon.md "Crashes"), against the real systemd booted as PID 1 of a new
 * PID namespace (test/restart/support/service-manager.ts): a .socket unit and a Type=notify service
 * with FileDescriptorStoreMax= and Restart=on-failure, as the shipped unit has. The daemon stores
 * each connection in the fd store at its accept (FDSTORE=1) and a checkpoint at every interval; its
 * main process is killed with SIGKILL twice, 5 s apart, while a QEMU-like client (legacy-client.py,
 * one request in one write every 50 ms, as QEMU writes them) waits for its replies: systemd starts the
 * service again with the stored fds, every request is answered once, the counter never goes back,
 * and the new start says what it kept. Where systemd cannot run here the test is skipped, saying why.
 */
import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { pathToFileURL } from 'node:url';
import { CRASH_ON_VM_PID_ENV } from '../../src/helper/handover/kept.js';
import { describe, expect, test } from 'vitest';
import { ROOT } from '../daemon/support/daemon-process.js';
import { waitFor } from '../support/wait.js';
import { countMsg, fdStoreBedForFile, UNIT } from '../restart/support/service-manager.js';
import { expectEveryRequestAnsweredOnce, legacyClientProcess } from '../restart/support/legacy-client.js';

/** The goal: serving again this soon after the kill (printed, not asserted: a matter of timing). */
const GOAL_MS = 1000;

/** The shipped unit's lines that say when systemd starts the helper again (Restart=, RestartForceExitStatus=). */
function shippedRestartLines(): string[] {
  const unit = fs.readFileSync(path.join(ROOT, 'contrib/systemd/qemu-vmsr-helper.service'), 'utf8');
  return unit.split('\n').filter((l) => /^(Restart|RestartForceExitStatus)=/.test(l));
}

const bed = fdStoreBedForFile('vmsr-fdstore-crash-', 'fd-store crashes', shippedRestartLines());
/** Restarts the SIGHUP test may take to land one in the window after the exec. */
const WINDOW_TRIES = 8;

describe('crashes under systemd, the connections in its fd store', () => {
  test('the main process SIGKILLed twice 5 s apart: systemd starts it again with the stored connection, every request answered once, the counter never back', async (ctx) => {
    if (bed.manager === null) return ctx.skip(bed.why);
    const m = bed.manager;
    m.systemctl('start', `${UNIT}.service`);
    await waitFor(() => countMsg(bed.log(), 'Listening on') > 0, 'the service to listen', undefined, 30_000);
    const client = legacyClientProcess(bed.sock, { inside: (a) => m.inside(a), pauseS: 0.05, whole: true });
    await client.ready;
    // Held from its accept: the connection and the first checkpoint.
    await waitFor(() => Number(m.show('NFileDescriptorStore')) >= 2, 'the connection and a checkpoint in the fd store', undefined, 10_000);
    const serving: number[] = [];
    for (let i = 0; i < 2; i++) {
      await new Promise((r) => setTimeout(r, 5000));
      const pid = m.show('MainPID');
      const listening = countMsg(bed.log(), 'Listening on');
      const t0 = performance.now();
      m.systemctl('kill', '--signal=SIGKILL', `${UNIT}.service`);
      await waitFor(() => countMsg(bed.log(), 'Listening on') > listening, `the start after kill ${i + 1}`, undefined, 30_000);
      serving.push(performance.now() - t0);
      expect(m.show('MainPID')).not.toBe(pid);
    }
    await new Promise((r) => setTimeout(r, 1000));
    const s = await client.done();
    const text = bed.log();
    console.log(
      `${bed.why}: 2 SIGKILLs; kill to serving (ms) ${serving.map((x) => Math.round(x)).join(', ')} (goal under ${GOAL_MS} ms: ` +
        `${Math.max(...serving) < GOAL_MS ? 'met' : 'NOT met'}); longest request wait ${s.maxWaitMs.toFixed(1)} ms over ${s.sent} requests`,
    );
    expect(m.show('NRestarts')).toBe('2');
    const recovered = text.split('\n').filter((l) => l.includes('recovered from a crash'));
    expect(recovered).toHaveLength(2);
    for (const l of recovered) expect(l).toMatch(/1 QEMU connections kept; state restored from the checkpoint/);
    expectEveryRequestAnsweredOnce(s);
  }, 180_000);

  test('a checkpoint that crashes the process restoring it is not fed to the next one: the restoring mark in the fd store, then a fresh start that says why; the connection is still served', async (ctx) => {
    if (bed.manager === null) return ctx.skip(bed.why);
    const m = bed.manager;
    const client = await activeWithClient(m);
    // A busy process inside the namespace, registered over v2: the checkpoint holds it.
    const [cmd, ...args] = m.inside([process.execPath, '--input-type=module', '-e', REGISTER(bed.sock)]);
    const vm = spawn(cmd!, args, { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    vm.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const stopVm = () => void vm.kill('SIGKILL');
    try {
      await waitFor(() => /^registered \d+/m.test(out), 'the v2 registration', undefined, 30_000);
      const pid = Number(/^registered (\d+)/m.exec(out)![1]);
      m.systemctl('set-environment', `${CRASH_ON_VM_PID_ENV}=${pid}`);
      await new Promise((r) => setTimeout(r, 1500));
      const restarts = Number(m.show('NRestarts'));
      m.systemctl('kill', '--signal=SIGKILL', `${UNIT}.service`);
      await waitFor(
        () => /no checkpoint restored \(the process before died while restoring it\)/.test(bed.log()),
        'the fresh start after the crashed restore',
        undefined,
        60_000,
      );
      expect(Number(m.show('NRestarts')), 'one restart for the kill, one for the restore that crashed').toBe(restarts + 2);
      expect(bed.log()).toContain(`${CRASH_ON_VM_PID_ENV}: crashing inside the restore, as asked`);
    } finally {
      m.systemctl('unset-environment', CRASH_ON_VM_PID_ENV);
      stopVm();
    }
    await new Promise((r) => setTimeout(r, 1000));
    const s = await client.done();
    expect(s.error).toBeNull();
    expect(s.answered).toBe(s.sent);
    expect(s.backwards).toBe(0);
  }, 180_000);

  test('a SIGHUP in the window after a restart exec ends the main process, and systemd starts it again with the stored connection (the shipped unit forces a restart on SIGHUP)', async (ctx) => {
    if (bed.manager === null) return ctx.skip(bed.why);
    const m = bed.manager;
    expect(shippedRestartLines()).toContain('RestartForceExitStatus=SIGHUP');
    const client = await activeWithClient(m);
    const restarts = Number(m.show('NRestarts'));
    const hup = () => m.systemctl('kill', '--signal=SIGHUP', '--kill-whom=main', `${UNIT}.service`);
    const executing = () => countMsg(bed.log(), 'restart in place: executing the installed binary');
    let attempt = 0;
    while (attempt < WINDOW_TRIES && Number(m.show('NRestarts')) === restarts) {
      attempt++;
      const before = executing();
      const listening = countMsg(bed.log(), 'Listening on');
      hup();
      await waitFor(() => executing() > before, `restart ${attempt} to execute`, undefined, 60_000);
      hup();
      // Until the new image serves, a SIGHUP is held (the guard) or finds no restarter yet, and is
      // ignored by design (docs/security.md, "A second SIGHUP during a restart"). "handed over" is
      // logged before that: the next try waits for "Listening on", said once the restarter is in place.
      await waitFor(
        () => Number(m.show('NRestarts')) > restarts || countMsg(bed.log(), 'Listening on') > listening,
        `restart ${attempt} to end: the new image serving, or systemd restarting the service the SIGHUP ended`,
        undefined,
        60_000,
      );
    }
    console.log(`the second SIGHUP ended the new image on try ${attempt} of ${WINDOW_TRIES}`);
    expect(Number(m.show('NRestarts')), `a SIGHUP landing in the exec window within ${WINDOW_TRIES} tries`).toBe(restarts + 1);
    await waitFor(() => m.show('ActiveState') === 'active', 'the service started again', undefined, 60_000);
    await new Promise((r) => setTimeout(r, 1000));
    const s = await client.done();
    expectEveryRequestAnsweredOnce(s);
  }, 600_000);
});

/** The service active (started when an earlier test left it stopped), and a QEMU-like client connected to it. */
async function activeWithClient(m: NonNullable<typeof bed.manager>): Promise<ReturnType<typeof legacyClientProcess>> {
  if (m.show('ActiveState') !== 'active') {
    const before = countMsg(bed.log(), 'Listening on');
    m.systemctl('start', `${UNIT}.service`);
    await waitFor(() => countMsg(bed.log(), 'Listening on') > before, 'the service to listen', undefined, 30_000);
  }
  const client = legacyClientProcess(bed.sock, { inside: (a) => m.inside(a), pauseS: 0.05, whole: true });
  await client.ready;
  return client;
}

/** A v2 client that registers a busy child of its own, prints `registered <pid>` and stays. */
function REGISTER(sock: string): string {
  const client = pathToFileURL(path.join(ROOT, 'dist/src/client/v2-client.js')).href;
  return `import { spawn } from 'node:child_process';
const { V2Client } = await import(${JSON.stringify(client)});
const child = spawn(process.execPath, ['-e', 'setInterval(() => { const t = Date.now(); while (Date.now() - t < 20); }, 50)'], { stdio: 'ignore' });
process.on('exit', () => child.kill('SIGKILL'));
process.on('SIGTERM', () => process.exit(0));
const c = await V2Client.connect(${JSON.stringify(sock)});
await c.register({ pid: child.pid, vcpus: [{ tid: child.pid, vpkg: 0 }] });
console.log('registered ' + child.pid);
setInterval(() => {}, 1000);`;
}
