/**
 * A v2 connection outlives the process that opened it, and REGISTER's "a peer may register its
 * own process" used to trust the pid that SO_PEERCRED recorded at connect(). The attack: a user
 * connects, hands the connection to a child, exits, and waits until the kernel gives its pid to a
 * root process; the child then registers "itself" (pid 0) and would read the root process's energy.
 * The attacker is a real process of uid nobody, the pid is really reused (ns_last_pid), and the
 * daemon is the real one.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { E, encodeRegister, HELPER_TYPES, T } from '../../src/protocol/v2/codec.js';
import { FrameDecoder } from '../../src/protocol/v2/frame-decoder.js';
import { parseHelperFrame } from '../../src/protocol/v2/messages.js';
import { closeFd } from '../../src/os/libc/fds.js';
import { peerPidfd, socketpair } from '../../src/os/libc/sockets.js';
import { PYTHON } from '../support/fake-qemu.js';
import { waitFor } from '../support/wait.js';
import { NOBODY, notRoot, onCleanup, sleep, startDaemonOpenToAll } from './support.js';

const NS_LAST_PID = '/proc/sys/kernel/ns_last_pid';
/** Attempts at giving the attacker's pid to the victim (another process may take it first). */
const REUSE_TRIES = 20;
/** The unit of /proc/<pid>/stat's start time (USER_HZ is 100 on Linux). */
const START_TIME_TICK_MS = 10;

/**
 * argv: socket path, FIFO path. Connects (v2), prints its pid, forks a child that keeps the
 * connection, and exits; the child prints its own pid. The child reads hex frames from the FIFO (not
 * stdin: Node closes a child's stdin when that child exits), one per line: "old HEX" goes out on the
 * inherited connection, "new HEX" on a connection of its own; each answer is printed as "HEX".
 */
const ATTACKER = `
import os, socket, sys
MAGIC = b'VMS2'
def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    s.sendall(MAGIC)
    return s
def answer(s):
    head = b''
    while len(head) < 8:
        b = s.recv(8 - len(head))
        if not b: return 'closed'
        head += b
    n = int.from_bytes(head[4:8], 'little')
    body = b''
    while len(body) < n:
        b = s.recv(n - len(body))
        if not b: return 'closed'
        body += b
    return (head + body).hex()
old = connect()
print(os.getpid(), flush=True)
if os.fork():
    os._exit(0)
print(os.getpid(), flush=True)
for line in open(sys.argv[2]):
    which, frame = line.split()
    s = old if which == 'old' else connect()
    s.sendall(bytes.fromhex(frame))
    print(answer(s), flush=True)
`;

/** Decodes one helper frame from hex. */
function decode(hex: string): { type: number; code?: number; message?: string } {
  const d = new FrameDecoder(HELPER_TYPES);
  const frames = d.push(Buffer.from(hex, 'hex'));
  expect(frames).toHaveLength(1);
  const f = frames[0]!;
  if (!f.ok) throw new Error(`bad frame from the helper: ${f.error.message}`);
  const m = parseHelperFrame(f.value);
  if (!m.ok) throw new Error(`bad payload from the helper: ${m.error}`);
  return m.value as { type: number; code?: number; message?: string };
}

/** Lines the attacker prints, one at a time. */
function lines(p: ChildProcess): () => Promise<string> {
  let buf = '';
  const queue: string[] = [];
  p.stdout!.on('data', (d: Buffer) => {
    buf += d.toString();
    for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
      queue.push(buf.slice(0, i));
      buf = buf.slice(i + 1);
    }
  });
  return async () => {
    await waitFor(() => queue.length > 0, 'a line from the attacker', undefined, 10_000);
    return queue.shift()!;
  };
}

/** Starts a root `sleep` whose pid is `pid`, by setting ns_last_pid just before; null when another process took it. */
function spawnWithPid(pid: number): ChildProcess | null {
  fs.writeFileSync(NS_LAST_PID, String(pid - 1));
  const victim = spawn('sleep', ['60'], { stdio: 'ignore' });
  onCleanup(() => void victim.kill('SIGKILL'));
  if (victim.pid === pid) return victim;
  victim.kill('SIGKILL');
  return null;
}

/** Why the kernel cannot name the connecting process itself (SO_PEERPIDFD, Linux 6.5+), or null. */
function noPeerPidfd(): string | null {
  const [a, b] = socketpair();
  try {
    const fd = peerPidfd(a);
    if (fd >= 0) closeFd(fd);
    return fd >= 0 ? null : `the kernel gives no SO_PEERPIDFD (errno ${-fd}; Linux 6.5+ does)`;
  } finally {
    closeFd(a);
    closeFd(b);
  }
}

describe('REGISTER and pid reuse', () => {
  test.for([
    ['the daemon accepted the connection before', false],
    ['the daemon accepts the connection only after the reuse (SO_PEERPIDFD)', true],
  ] as const)(
    'a connection whose process has exited cannot register, as "itself", the root process that now has its pid: %s',
    async ([, acceptLate], ctx) => {
      const why = notRoot() ?? (acceptLate ? noPeerPidfd() : null);
      if (why) return ctx.skip(why);
      const { daemon, dir, sock } = await startDaemonOpenToAll();
      // A busy daemon accepts late: stopped, it accepts only after the attacker's pid went to the victim.
      if (acceptLate) {
        daemon.proc.kill('SIGSTOP');
        onCleanup(() => void daemon.proc.kill('SIGCONT'));
      }

      const fifo = path.join(dir, 'commands');
      execFileSync('mkfifo', ['-m', '0644', fifo]);
      const attacker = spawn(PYTHON, ['-c', ATTACKER, sock, fifo], { uid: NOBODY, gid: NOBODY, stdio: ['ignore', 'pipe', 'inherit'] });
      onCleanup(() => void attacker.kill('SIGKILL'));
      const next = lines(attacker);
      const connectedPid = Number(await next());
      const childPid = Number(await next());
      // The process that connected has exited and been reaped; its pid is free.
      await new Promise((r) => (attacker.exitCode !== null ? r(null) : attacker.once('exit', r)));
      expect(fs.existsSync(`/proc/${connectedPid}`)).toBe(false);

      // Start times count clock ticks (10 ms): a process started in the very tick of the one that
      // connected is not told apart by them (docs/security.md, "Limit"). A natural pid wrap takes far longer.
      await sleep(START_TIME_TICK_MS * 3);
      let victim: ChildProcess | null = null;
      for (let i = 0; i < REUSE_TRIES && !victim; i++) victim = spawnWithPid(connectedPid);
      if (!victim) return ctx.skip(`could not give pid ${connectedPid} to a new process in ${REUSE_TRIES} tries (a busy host took it)`);
      expect(fs.statSync(`/proc/${victim.pid}`).uid).toBe(0);
      if (acceptLate) daemon.proc.kill('SIGCONT');

      const commands = fs.openSync(fifo, 'w');
      onCleanup(() => fs.closeSync(commands));
      const send = (which: 'old' | 'new', frame: Buffer) => fs.writeSync(commands, `${which} ${frame.toString('hex')}\n`);

      const attack = encodeRegister({ pid: 0, vcpus: [{ tid: victim.pid!, vpkg: 0 }] });
      send('old', attack);
      const refused = decode(await next());
      expect(refused.type).toBe(T.ERROR);
      expect(refused.code).toBe(E.NOT_PERMITTED);
      expect(refused.message).toContain('the process that connected has exited; its pid now names another process');

      // Naming the pid outright is refused too: it belongs to root.
      const named = encodeRegister({ pid: victim.pid!, vcpus: [{ tid: victim.pid!, vpkg: 0 }] });
      send('old', named);
      expect(decode(await next())).toMatchObject({ type: T.ERROR, code: E.NOT_PERMITTED });

      // The rule still admits a process registering itself on a connection it opened: the attacker's child, on its own.
      const self = encodeRegister({ pid: 0, vcpus: [{ tid: childPid, vpkg: 0 }] });
      send('new', self);
      expect(decode(await next()).type).toBe(T.REGISTERED);
    },
  );
});
