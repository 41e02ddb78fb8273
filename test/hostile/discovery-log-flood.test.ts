/**
 * Discovery log floods: another user starts short-lived processes that look like QEMU, many a
 * second. The daemon's "VM discovered" and "VM ended" lines stay bounded (VM_LOG_BURST each per
 * window) and what was held back is counted at shutdown; each line names its VM under `vm`, so the
 * record's own `pid` and `name` stay the daemon's.
 */
import { spawn } from 'node:child_process';
import { describe, expect, test } from 'vitest';
import { VM_LOG_BURST } from '../../src/helper/v2/vm-log.js';
import { DEFAULT_LOG_WINDOW_MS } from '../../src/logging/log-limiter.js';
import { hostArgs, startHelper, waitFor } from '../daemon/support/daemon-process.js';
import { FakeQemu, PYTHON } from '../support/fake-qemu.js';
import { fakeHost, NOBODY, notRoot, onCleanup, track } from './support.js';

/** Forks `count` QEMU look-alikes (comm qemu-system-x86, one `CPU 0/KVM` thread), `rate` a second, each living `life` s. */
const STORM = String.raw`
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def setname(n): libc.prctl(15, ctypes.c_char_p(n.encode()[:15]), 0, 0, 0)
count, rate, life = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
for k in range(count):
    if os.fork() == 0:
        setname("qemu-system-x86")
        threading.Thread(target=lambda: (setname("CPU 0/KVM"), time.sleep(life)), daemon=True).start()
        time.sleep(life)
        os._exit(0)
    time.sleep(1 / rate)
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0: break
        except ChildProcessError: break
while True:
    try: os.wait()
    except ChildProcessError: break
`;

/** 40 look-alikes a second for 3 s, each alive 0.5 s: several samples (0.1 s) see each start and end. */
const STORM_COUNT = 120;
const STORM_RATE = 40;
const STORM_LIFE_S = 0.5;
const UUID = '0f0e0d0c-0b0a-4908-8706-050403020100';

type Rec = Record<string, unknown> & { msg: string; vm?: { name: string | null; uuid: string | null; pid: number; uid: number } };

function records(stderr: string): Rec[] {
  return stderr
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Rec);
}

describe('discovery log flood', () => {
  test('a storm of short-lived QEMU look-alikes of another user logs a bounded number of VM lines, each naming its VM apart from the daemon, and the held-back count at shutdown', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { host, sock } = fakeHost();
    const helper = track(await startHelper(['-k', sock, ...hostArgs(host), '--interval', '0.1']));
    const daemonPid = helper.proc.pid!;
    // This host's /proc is shared: QEMU look-alikes of other jobs are discovered too, and count
    // against the same burst. Too many of them already, and this VM's line could be held back.
    await new Promise((r) => setTimeout(r, 1000));
    const foreign = records(helper.stderr()).filter((r) => r.msg.startsWith('VM discovered')).length;
    if (foreign >= VM_LOG_BURST / 2)
      return ctx.skip(`${foreign} QEMU-like processes of other jobs run on this host: too many to tell this test's lines apart`);

    // One named VM first: its lines carry its name, UUID and pid.
    const named = new FakeQemu({ vcpus: 1, args: ['-name', 'guest=nbvm1', '-uuid', UUID] });
    onCleanup(() => named.kill());
    await named.ready();
    const logged = (kind: string) => () => records(helper.stderr()).some((r) => r.msg.startsWith(kind) && r.vm?.pid === named.pid);
    await waitFor(logged('VM discovered'), 'nbvm1 discovered', helper);
    await named.kill();
    await waitFor(logged('VM ended'), 'nbvm1 ended', helper);

    const storm = spawn(PYTHON, ['-c', STORM, String(STORM_COUNT), String(STORM_RATE), String(STORM_LIFE_S)], {
      argv0: 'qemu-system-x86_64',
      uid: NOBODY,
      gid: NOBODY,
      stdio: 'ignore',
    });
    onCleanup(() => void storm.kill('SIGKILL'));
    const stormDone = new Promise((r) => storm.once('exit', r));
    // The storm lasts STORM_COUNT / STORM_RATE s (3 s); the window (60 s) does not end meanwhile.
    await stormDone;
    await new Promise((r) => setTimeout(r, 1000)); // the last look-alikes end and are sampled
    const during = records(helper.stderr());
    expect(await helper.stop('SIGTERM')).toBe(0);
    const all = records(helper.stderr());

    const discovered = during.filter((r) => r.msg.startsWith('VM discovered') && !r.msg.includes('not sampled'));
    const ended = during.filter((r) => r.msg.startsWith('VM ended'));
    // Bounded: VM_LOG_BURST of each kind in the window, whatever the storm's size.
    expect(discovered).toHaveLength(VM_LOG_BURST);
    expect(ended).toHaveLength(VM_LOG_BURST);
    expect(discovered[VM_LOG_BURST - 1]!.msg).toContain(
      `further 'VM discovered' messages are counted for ${DEFAULT_LOG_WINDOW_MS / 1000} s`,
    );

    // Each names its VM under `vm`; `pid` and `name` are the daemon's.
    for (const r of [...discovered, ...ended]) {
      expect(r.pid).toBe(daemonPid);
      expect(r.name).toBe('vmsr-helper');
      expect(Object.keys(r.vm!).sort()).toEqual(['name', 'pid', 'uid', 'uuid']);
      expect(typeof r.vm!.pid).toBe('number');
    }
    const mine = (rs: Rec[]) => rs.find((r) => r.vm!.pid === named.pid);
    expect(mine(discovered)!.vm).toEqual({ name: 'nbvm1', uuid: UUID, pid: named.pid, uid: 0 });
    expect(mine(ended)!.vm).toEqual({ name: 'nbvm1', uuid: UUID, pid: named.pid, uid: 0 });
    expect(mine(ended)).toMatchObject({ source: 'discovered', vmId: mine(discovered)!.vmId });
    expect(discovered.filter((r) => r.vm!.uid === NOBODY).length).toBeGreaterThan(0);

    // At shutdown the counts held back are logged, one line per kind.
    for (const kind of ['VM discovered', 'VM ended']) {
      const held = all.filter((r) => r.cause === kind && typeof r.suppressed === 'number');
      expect(held).toHaveLength(1);
      expect(held[0]!.msg).toMatch(new RegExp(`^${held[0]!.suppressed as number} more '${kind}' messages suppressed in the last \\d+ s$`));
      // Most of the storm was held back, not lost: more than the storm's first second.
      expect(held[0]!.suppressed as number).toBeGreaterThan(STORM_RATE);
    }
    // No record of the daemon carries a bare null error.
    expect(all.filter((r) => 'err' in r && r.err === null)).toEqual([]);
  });
});
