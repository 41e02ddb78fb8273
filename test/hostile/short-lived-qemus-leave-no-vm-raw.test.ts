/**
 * Exact mode once never forgot a QEMU: after 4,096 exact QEMU processes over the helper's life (short-lived
 * ones of one uid reached it in about 3.5 minutes) every new VM was answered raw, with nothing logged.
 * Its table of processes is now bounded per uid by discovery's share rule and forgets a process once it
 * ended. Here the real daemon (-u nobody, exact mode) runs with `--max-discovered-vms 64` (the table's
 * size too: a uid that is not root or --socket-group holds at most 16): fake QEMUs of one uid fill its
 * share, one more is left raw (logged once), a VM of another uid is exact all the same; then that uid
 * runs two rounds of 16 short-lived QEMUs (49 in all, three times its share), and a new VM of each uid
 * is still exact. Other users' QEMU-like processes on the host take discovery slots of the uids'
 * common share: when they leave too few, the test says so and ends.
 */
import fs from 'node:fs';
import { describe, expect, test } from 'vitest';
import { logLines, notRoot, onCleanup, startExactDaemon } from './support.js';
import { waitFor, type DaemonChild } from '../daemon/support/daemon-process.js';
import { VmsrFakeQemu } from '../support/vmsr-fake-qemu.js';

const why = notRoot();
const TABLE = 64;
const PER_UID = TABLE / 4;
const EXACT = 'guest energy: exact for this VM from this window on';
const FULL = 'guest energy: cannot count a new QEMU process exactly';

/** `n` uids that no user in /etc/passwd and no process on the host has (other tests' fakes run as nobody). */
function freeUids(n: number): number[] {
  const used = new Set<number>();
  for (const line of fs.readFileSync('/etc/passwd', 'utf8').split('\n')) used.add(Number(line.split(':')[2]));
  for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      used.add(Number(/^Uid:\s+(\d+)/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]));
    } catch {
      /* gone */
    }
  }
  const out: number[] = [];
  for (let u = 50_000 + Math.floor(Math.random() * 10_000); out.length < n; u++) if (!used.has(u)) out.push(u);
  return out;
}

/** The pids the daemon said are exact. */
function exactPids(daemon: DaemonChild): Set<number> {
  return new Set(logLines(daemon.stderr()).flatMap((l) => (l.msg === EXACT ? [l.pid as number] : [])));
}

describe.skipIf(why !== null)('exact mode and short-lived QEMUs', () => {
  if (why !== null) console.log(`skipped: ${why}`);

  test('QEMUs that ended leave no new VM raw, and a uid at its share leaves other uids exact', async () => {
    const { daemon, sock, dir, exe } = await startExactDaemon(['--max-discovered-vms', String(TABLE)]);
    const [a, b] = freeUids(2) as [number, number];
    // argv[0] is the installed-looking executable: the helper (nobody) cannot follow another uid's /proc/<pid>/exe.
    const start = async (uid: number, n: number) => {
      const qs = Array.from({ length: n }, () => {
        const q = new VmsrFakeQemu({ exe, socket: sock, logDir: dir, sockets: 1, perSocket: 1, vcpus: 1, uid, argv0: exe });
        onCleanup(() => q.kill());
        return q;
      });
      return Promise.all(qs.map((q) => q.ready()));
    };
    // Discovery's common share of uids other than root's: A's 16 and B's 1 leave 15 to other users' processes.
    const crowded = () => daemon.stderr().includes('discovery full: others');
    const exact = (qs: VmsrFakeQemu[], what: string) =>
      waitFor(() => crowded() || qs.every((q) => exactPids(daemon).has(q.pid)), `${what} to be exact`, daemon, 120_000);
    const skipped = () => crowded() && console.log('skipped: other users’ QEMU-like processes took the uids’ common discovery share');
    let started = 0;

    const fill = await start(a, PER_UID);
    started += PER_UID;
    await exact(fill, `uid ${a}'s ${PER_UID} QEMUs`);
    if (skipped()) return;
    const [over] = await start(a, 1);
    started++;
    await waitFor(() => daemon.stderr().includes(FULL), 'the daemon to say the uid share is full', daemon, 60_000);
    // Waited for: 4 more windows of the one over the share, each asking (raw).
    await over!.windowsClosed(over!.windows().length + 4);
    expect(exactPids(daemon).has(over!.pid), 'a QEMU past its uid share is exact').toBe(false);
    const [other] = await start(b, 1);
    await exact([other!], `uid ${b}'s QEMU beside a full share`);
    if (skipped()) return;
    await Promise.all([...fill, over!, other!].map((q) => q.kill()));

    for (let round = 1; round <= 2; round++) {
      const qs = await start(a, PER_UID);
      started += PER_UID;
      await exact(qs, `round ${round} of uid ${a}'s short-lived QEMUs`);
      if (skipped()) return;
      await Promise.all(qs.map((q) => q.kill()));
    }
    expect(started).toBeGreaterThan(2 * PER_UID);

    const late = await Promise.all([start(a, 1), start(b, 1)]);
    await exact(late.flat(), `a new QEMU of uid ${a} and one of uid ${b}, after ${started} of uid ${a}`);
    if (skipped()) return;
    const full = logLines(daemon.stderr()).filter((l) => typeof l.msg === 'string' && l.msg.startsWith(FULL));
    console.log(`${started} QEMUs of uid ${a} over a table of ${TABLE}; said full: ${JSON.stringify(full.map((l) => [l.uid, l.bound]))}`);
    expect(full.map((l) => [l.uid, l.bound])).toEqual([[a, 'uid']]);
  }, 600_000);
});
