/**
 * The processes exact mode remembers (src/helper/guest/guest-peers.ts), on real processes: named by
 * (pid, start time), a uid that is not preferred held to its share (said once), and a process that
 * ended forgotten so that its place is free again.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import pino from 'pino';
import { afterEach, describe, expect, test } from 'vitest';
import { GuestPeers } from '../../../src/helper/guest/guest-peers.js';
import { readStarttime } from '../../../src/os/proc-starttime.js';

const S = 1_000_000_000n;
const children: ChildProcess[] = [];
afterEach(() => {
  for (const c of children.splice(0)) c.kill('SIGKILL');
});

function sleeper(): { child: ChildProcess; key: { pid: number; starttime: number } } {
  const child = spawn('sleep', ['60'], { stdio: 'ignore' });
  children.push(child);
  return { child, key: { pid: child.pid!, starttime: readStarttime('/proc', child.pid!)! } };
}

describe('GuestPeers', () => {
  test('holds a uid that is not preferred to its share, says so once, and frees the place of a process that ended', async () => {
    const lines: string[] = [];
    const forgotten: string[] = [];
    const peers = new GuestPeers<string>({
      log: pino({ level: 'info' }, { write: (l: string) => void lines.push(l) }),
      alive: (k) => readStarttime('/proc', k.pid) === k.starttime,
      droppable: () => false,
      forgotten: (p) => void forgotten.push(p),
      capacity: 8,
    });
    const attacker = { uid: 1234, preferred: false };
    const [a, b, c] = [sleeper(), sleeper(), sleeper()];
    let now = 10n * S;
    // One process asking, as the owner `who`, with `made` its peer if it is new.
    const ask = (key: { pid: number; starttime: number }, who: { uid: number; preferred: boolean }, made: string) =>
      peers.get(
        key,
        () => who,
        now,
        () => made,
      );
    expect(ask(a.key, attacker, 'a')).toBe('a');
    expect(ask(b.key, attacker, 'b')).toBe('b');
    // A quarter of 8: the third is not remembered (left raw), and that is said once.
    expect(ask(c.key, attacker, 'c')).toBeUndefined();
    expect(ask(c.key, attacker, 'c')).toBeUndefined();
    expect(lines.filter((l) => l.includes('cannot count a new QEMU process exactly'))).toHaveLength(1);
    // The same pid with another start time is another process.
    expect(ask({ ...a.key, starttime: a.key.starttime + 1 }, { uid: 0, preferred: true }, 'a2')).toBe('a2');
    expect(ask(a.key, attacker, 'again')).toBe('a');
    // a ends; once it has not asked for a while its place is free.
    const gone = new Promise((r) => a.child.once('exit', r));
    a.child.kill('SIGKILL');
    await gone;
    now += 4n * S;
    expect(ask(c.key, attacker, 'c')).toBe('c');
    // (a2 named no live process: forgotten too.)
    expect(forgotten.sort()).toEqual(['a', 'a2']);
    expect([...peers.values()].sort()).toEqual(['b', 'c']);
  });
});
