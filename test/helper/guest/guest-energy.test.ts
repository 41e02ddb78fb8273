/**
 * GuestEnergy (helper/guest/guest-energy.ts) on a real process as the VM: when a window's threads
 * are read against its requests (the start read after the reply, the end read before it).
 */
import os from 'node:os';
import pino from 'pino';
import { afterEach, describe, expect, test } from 'vitest';
import { GuestEnergy } from '../../../src/helper/guest/guest-energy.js';
import { ProcTaskReader, type KeptFdLedger } from '../../../src/os/proc-tasks.js';
import { exitProbeKind, type ExitProbeKind } from '../../../src/helper/guest/thread-exits.js';
import { readStarttime } from '../../../src/os/proc-starttime.js';
import { ThreadedProcess } from '../../support/threads.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const S = 1_000_000_000n;

/** The process as the legacy session gives it: its connection's credentials and start time. */
function peerOf(p: ThreadedProcess) {
  return { pid: p.pid, uid: 0, gid: 0, starttime: readStarttime('/proc', p.pid)! };
}

/** A process whose burner thread is its vCPU, and GuestEnergy over it on a clock the test moves. */
async function setup(o: { exitProbe?: ExitProbeKind; ledger?: KeptFdLedger } = {}) {
  const p = new ThreadedProcess();
  cleanups.push(() => p.kill());
  await p.ready();
  await p.cmd('start 2 busy');
  const before = p.tids();
  await p.cmd('burner');
  const vcpu = p.tids().find((t) => !before.includes(t))!;
  const tasks = new ProcTaskReader('/proc');
  cleanups.push(() => tasks.close());
  tasks.read(p.pid);
  const clock = { now: 10n * S };
  let exactJ = 0;
  const find = (pid: number) =>
    pid === p.pid ? { vmId: 7, pid, starttime: peerOf(p).starttime, vcpus: new Map([[vcpu, 0]]), nvpkg: 1, exactJ } : undefined;
  // The debug lines of the windows closed: whether each was answered from a forecast.
  const windows: boolean[] = [];
  const log = pino(
    { level: 'debug' },
    { write: (l: string) => void (l.includes('"guest window"') && windows.push(l.includes('"forecast":true'))) },
  );
  const guest = new GuestEnergy({
    procRoot: '/proc',
    // Every CPU of this machine in package 0, so that the threads' CPUs all map to it.
    host: {
      vendor: 'intel',
      clkTck: 100,
      cpus: os.cpus().map((_c, cpu) => ({ cpu, pkg: 0 })),
      packages: [{ pkg: 0, powerUnit: 0xa0e03n }],
    },
    unitJ: 2 ** -14,
    find,
    findAll: (pids) => new Map([...pids].flatMap((pid) => (find(pid) ? [[pid, find(pid)!] as const] : []))),
    log,
    clock: () => clock.now,
    maxThreads: 64,
    heldFds: (pid, tid) => tasks.heldFds(pid, tid),
    versionOf: () => Promise.resolve('10.0.2'),
    ...o,
  });
  // The first window finds the version unknown (read asynchronously) and stays raw.
  expect(guest.answer(peerOf(p), 0)).toBeUndefined();
  await new Promise((r) => setTimeout(r, 10));
  clock.now += S;
  guest.answer(peerOf(p), 0);
  clock.now += S / 100n;
  return { p, guest, clock, windows, addJ: (j: number) => (exactJ += j) };
}

describe('GuestEnergy', () => {
  test('a window start is answered before its threads are read, and they are read by afterReplies', async () => {
    const { p, guest } = await setup();
    expect(guest.answer(peerOf(p), 0)).toBe(0n);
    expect(guest.state()[0]!.start).toBeNull();
    guest.afterReplies();
    const start = guest.state()[0]!.start!;
    expect([...start.keys()].sort()).toEqual(p.tids().filter((t) => t !== p.pid));
  });

  test('the vCPU ticks after the start reply are credited at the window end when afterReplies read the start', async () => {
    const { p, guest, clock, addJ } = await setup();
    guest.answer(peerOf(p), 0);
    guest.afterReplies();
    await p.cmd('burn'); // the vCPU runs 50 ms (5 ticks at 100 Hz)
    addJ(2);
    clock.now += S;
    expect(guest.answer(peerOf(p), 0)!).toBeGreaterThan(0n);
    guest.afterReplies(); // the window settled on the threads read after the reply
    const v = guest.view(7)!;
    expect(v.windows).toBe(1);
    // The end was answered from the vCPU's run time, an upper bound of its ticks (4-5 here, the
    // forecast 5-6): QEMU credited at least 4/6 of it, and the rest is carried, nothing lost.
    expect(v.guestJ).toBeGreaterThan(1.3);
    expect(v.guestJ).toBeLessThanOrEqual(2);
    expect(v.exactJ).toBe(2);
    expect(guest.state()[0]!.owedUnits * 2 ** -14).toBeCloseTo(2 - v.guestJ, 9);
  });

  test('an end whose window lost a thread is answered a zero delta from the reads before the reply, its energy carried', async () => {
    const { p, guest, clock, addJ } = await setup();
    const start = guest.answer(peerOf(p), 0)!;
    guest.afterReplies();
    await p.cmd('burn');
    await p.cmd('stop 1'); // a thread QEMU listed exits: its tick delta would underflow
    addJ(2);
    clock.now += S;
    expect(guest.answer(peerOf(p), 0)).toBe(start);
    guest.afterReplies();
    const v = guest.view(7)!;
    expect(v.guestJ).toBe(0);
    expect(v.exactJ).toBe(2);
    expect(guest.state()[0]!.carriedWindows).toBe(1);
  });

  // pidfds where the kernel has PIDFD_THREAD (6.9+), the task directory's entries everywhere.
  const probes: ExitProbeKind[] = exitProbeKind() === 'pidfd' ? ['pidfd', 'tasks'] : ['tasks'];
  test.each(probes)(
    'an end whose window lost a thread and gained another (the same count) is answered a zero delta, with exits told by %s',
    async (exitProbe) => {
      const { p, guest, clock, windows, addJ } = await setup({ exitProbe });
      const start = guest.answer(peerOf(p), 0)!;
      guest.afterReplies();
      await p.cmd('burn');
      await p.cmd('stop 1'); // a thread QEMU listed exits: its tick delta would underflow
      await p.cmd('start 1 busy'); // and another starts: the task directory's count is as at the start
      addJ(2);
      clock.now += S;
      expect(guest.answer(peerOf(p), 0), 'a zero delta').toBe(start);
      guest.afterReplies();
      expect(windows, 'answered from a forecast: the count did not move').toEqual([true]);
      const v = guest.view(7)!;
      expect(v.guestJ).toBe(0);
      expect(v.exitWindows).toBe(1);
      expect(v.garbageWindows).toBe(0);
      // The energy is carried: the next window, with no exit, pays it.
      clock.now += S / 1000n;
      guest.answer(peerOf(p), 0);
      guest.afterReplies();
      await p.cmd('burn');
      addJ(2);
      clock.now += S;
      expect(guest.answer(peerOf(p), 0)!).toBeGreaterThan(start);
      guest.afterReplies();
      expect(guest.view(7)!.guestJ).toBeGreaterThan(2.6);
    },
  );

  test('exits are told by the task directory when the VM fd share has no room for the pidfds, and the fds granted are given back', async () => {
    // A share with no room: nothing granted, so nothing may be given back either.
    const held = { fds: 0 };
    const ledger: KeptFdLedger = { grant: () => 0, release: (_pid, n) => void (held.fds -= n) };
    const { p, guest, clock, addJ } = await setup({ ledger });
    const start = guest.answer(peerOf(p), 0)!;
    guest.afterReplies();
    await p.cmd('burn');
    await p.cmd('stop 1');
    await p.cmd('start 1 busy');
    addJ(2);
    clock.now += S;
    expect(guest.answer(peerOf(p), 0), 'a zero delta all the same').toBe(start);
    guest.afterReplies();
    expect(guest.view(7)!.exitWindows).toBe(1);
    expect(held.fds).toBe(0);
  });

  test('an end with the same threads is answered from a forecast and settled once the reply has left', async () => {
    await settledWindow(); // its checks
  });

  test('an end whose window gained a thread is answered from the reads before the reply', async () => {
    const { p, guest, clock, windows, addJ } = await setup();
    guest.answer(peerOf(p), 0);
    guest.afterReplies();
    await p.cmd('start 1');
    await p.cmd('burn');
    addJ(2);
    clock.now += S;
    guest.answer(peerOf(p), 0);
    expect(windows).toEqual([false]);
    expect(guest.view(7)!.guestJ).toBeGreaterThan(1.9); // solved on the ticks read: all of it but QEMU's rounding
  });

  test('a window start is read at the next request when afterReplies was not called', async () => {
    const { p, guest, clock } = await setup();
    guest.answer(peerOf(p), 0); // the start, its read pending
    clock.now += S;
    guest.answer(peerOf(p), 0); // the end: the start read runs first, so the window closes with threads
    expect(guest.view(7)!.windows).toBe(1);
    expect(guest.state()[0]!.loop.nbVcpu.size).toBe(1); // QEMU's vCPU count saw the vCPU thread
  });

  /** A window closed from a forecast and settled once its reply left; the clock then at its end. */
  async function settledWindow() {
    const t = await setup();
    t.guest.answer(peerOf(t.p), 0);
    t.guest.afterReplies();
    await t.p.cmd('burn');
    t.addJ(2);
    t.clock.now += S;
    t.guest.answer(peerOf(t.p), 0);
    expect(t.windows, 'nothing settled before the reply left').toEqual([]);
    t.guest.afterReplies();
    expect(t.windows).toEqual([true]);
    return t;
  }

  test('a window start soon after the last settling, with the same threads, takes its read and reads nothing', async () => {
    const { p, guest, clock, windows, addJ } = await settledWindow();
    clock.now += S / 1000n;
    guest.answer(peerOf(p), 0);
    const start = guest.state()[0]!.start;
    expect(start, 'the start read is there before any afterReplies').not.toBeNull();
    expect([...start!.keys()].sort()).toEqual(p.tids().filter((t) => t !== p.pid));
    // Its end is again answered from a forecast on it. Two windows of 2 J: what the first forecast
    // carried is paid in the second, but the second's own error.
    await p.cmd('burn');
    addJ(2);
    clock.now += S;
    guest.answer(peerOf(p), 0);
    guest.afterReplies();
    expect(windows).toEqual([true, true]);
    expect(guest.view(7)!.guestJ).toBeGreaterThan(3.3);
  });

  test('a window start after a thread started is read as usual, the new thread with it', async () => {
    const { p, guest, clock } = await settledWindow();
    await p.cmd('start 1');
    clock.now += S / 1000n;
    guest.answer(peerOf(p), 0);
    expect(guest.state()[0]!.start).toBeNull();
    guest.afterReplies();
    expect([...guest.state()[0]!.start!.keys()].sort()).toEqual(p.tids().filter((t) => t !== p.pid));
  });

  test('a window start more than 20 ms after the last settling is read as usual', async () => {
    const { p, guest, clock } = await settledWindow();
    clock.now += (S * 3n) / 100n;
    guest.answer(peerOf(p), 0);
    expect(guest.state()[0]!.start).toBeNull();
    guest.afterReplies();
    expect(guest.state()[0]!.start).not.toBeNull();
  });

  test("a window's end takes its VM as the last sample left it (sampled), not as looked up at the request", async () => {
    const { p, guest, clock, addJ } = await setup();
    guest.answer(peerOf(p), 0);
    guest.afterReplies();
    await p.cmd('burn');
    addJ(2);
    guest.sampled(); // the last sample before the end: 2 J attributed
    addJ(5); // not sampled yet when the end comes
    clock.now += S;
    guest.answer(peerOf(p), 0);
    guest.afterReplies();
    expect(guest.view(7)!.exactJ).toBe(2);
  });
});
