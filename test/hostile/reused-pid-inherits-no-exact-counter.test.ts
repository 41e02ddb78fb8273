/**
 * A new VM on the pid of an exact-mode VM that ended inherited the dead VM's
 * counter, frozen: it started at the old value and gained nothing for 8 busy windows. Exact mode now
 * names a process by (pid, start time): here the real daemon (-u nobody) sees fake QEMU B come up
 * on A's pid (reused for real, through ns_last_pid) and counts B afresh: B's guest gains energy.
 */
import fs from 'node:fs';
import { describe, expect, test } from 'vitest';
import { NOBODY, notRoot, onCleanup, said, startExactDaemon } from './support.js';
import { VmsrFakeQemu } from '../support/vmsr-fake-qemu.js';

const NS_LAST_PID = '/proc/sys/kernel/ns_last_pid';
const why = notRoot() ?? (fs.existsSync(NS_LAST_PID) ? null : `${NS_LAST_PID} is missing: a pid cannot be reused on purpose`);

describe.skipIf(why !== null)('exact mode and a reused pid', () => {
  if (why !== null) console.log(`skipped: ${why}`);

  test('a new VM on an exact VM’s reused pid starts fresh counters and is credited', async () => {
    const { daemon, sock, dir, exe } = await startExactDaemon();
    const fake = (o: Partial<ConstructorParameters<typeof VmsrFakeQemu>[0]> = {}) => {
      const q = new VmsrFakeQemu({ exe, socket: sock, logDir: dir, sockets: 1, perSocket: 1, vcpus: 1, uid: NOBODY, ...o });
      onCleanup(() => q.kill());
      return q;
    };
    const a = await fake().ready();
    await a.cmd('spin 0');
    await said(daemon, 'guest energy: exact for this VM from this window on');
    await a.windowsClosed(a.windows().length + 4);
    const pid = a.pid;
    await a.kill();
    // B on A's pid: ns_last_pid set just before the fork; another process on the host may take the pid first (tried again).
    let b: VmsrFakeQemu | null = null;
    for (let i = 0; i < 50 && b === null; i++) {
      fs.writeFileSync(NS_LAST_PID, String(pid - 1));
      const q = fake();
      if (q.pid === pid) b = q;
      else await q.kill();
    }
    if (b === null) return console.log(`skipped: pid ${pid} was taken by other processes 50 times`);
    await b.ready();
    await b.cmd('spin 0');
    await said(daemon, 'guest energy: exact for this VM from this window on', 2);
    // Waited for: 8 windows of B since it is exact (about 1 s each).
    const from = b.windows().length;
    const ws = await b.windowsClosed(from + 8, 120_000);
    const gained = ws.slice(from).reduce((s, w) => s + w.credited, 0);
    console.log(`reused pid ${pid}: B credited ${gained} units over 8 busy windows`);
    expect(gained).toBeGreaterThan(0);
  }, 400_000);
});
