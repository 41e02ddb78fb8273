/**
 * A second uid of --socket-group (where ordinary users are in `kvm`, any of them) filled every
 * connection slot (--max-connections 300) with legacy connections it got answers on, or with idle
 * v2 connections past their magic: no new QEMU connection was answered (0 of 50). The per-uid share
 * did not bind socket-group uids, and eviction took only connections not yet read. Pipelining
 * unread STATS_FD requests over 400 reconnecting connections slowed new QEMU connections (0.87 s at
 * the median in the finding; here the first ones waited over 10 s in the listen backlog). Now a uid's
 * share binds the socket's group too, v2 requests are answered at most V2_REQUESTS_PER_TURN a turn
 * of the event loop (Node accepts one connection a turn), and a QEMU process's first
 * connection is outside the shares and gets a slot whoever holds them, closing the oldest
 * connection that is not QEMU's of the user holding the most.
 *
 * Against the real daemon dropped to -u nobody, socket root:kvm 0660: the attacker is a real process
 * of uid 65533 in kvm; QEMU a real process of uid 65532 in kvm, named qemu-system-x86_64 (as
 * discovery and the daemon recognise QEMU), a new one for each connection.
 */
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { hostArgs, LegacyClient, startHelper, tempDir } from '../daemon/support/daemon-process.js';
import { PYTHON } from '../support/fake-qemu.js';
import { fakeHost, notRoot, onCleanup, sleep, track } from './support.js';

const ATTACKER_UID = 65533;
const QEMU_UID = 65532;
const MAX_CONNECTIONS = 300;
const NEW_QEMUS = 10;
/**
 * Each new QEMU's wait for its reply: far above what is expected (milliseconds; the goal of 0.5 s is
 * printed, and measured by `npm run bench -- latency`); before, none was answered at all.
 */
const REPLY_DEADLINE_MS = 30_000;

/**
 * The attacker: keeps `n` connections open, reopening each the daemon closes. `legacy`: one legacy
 * request answered on each, then held; `v2idle`: the v2 magic, then held; `statsfd`: the v2 magic and
 * STATS_FD requests pipelined, never read. Prints "open N answered N" every 0.5 s.
 */
const ATTACKER = String.raw`
import os, selectors, socket, struct, sys, threading, time
path, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def watch():
    sys.stdin.read(); os._exit(0)
threading.Thread(target=watch, daemon=True).start()
first = {"legacy": struct.pack("<III", 0x606, 0, os.getpid()),
         "v2idle": b"VMS2",
         "statsfd": b"VMS2" + struct.pack("<HHII", 9, 0, 4, 0) * 4096}[mode]
sel = selectors.DefaultSelector()
answered = 0
def open_one():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        s.setblocking(False)
        s.send(first)
    except OSError:
        s.close(); return False
    sel.register(s, selectors.EVENT_READ if mode != "statsfd" else selectors.EVENT_READ)
    return True
last = 0
while True:
    while len(sel.get_map()) < n:
        if not open_one(): break
    for key, _ in sel.select(0.05):
        s = key.fileobj
        if mode == "statsfd":
            # never read the replies; only notice a close
            try:
                if s.recv(1, socket.MSG_PEEK) == b"":
                    raise OSError()
                continue
            except BlockingIOError:
                continue
            except OSError:
                sel.unregister(s); s.close(); continue
        try:
            d = s.recv(65536)
        except OSError:
            d = b""
        if d == b"":
            sel.unregister(s); s.close()
        elif mode == "legacy":
            answered += 1
    if time.monotonic() - last > 0.5:
        last = time.monotonic()
        print("open %d answered %d" % (len(sel.get_map()), answered), flush=True)
`;

/** A new QEMU (named qemu-system-x86_64): connects, sends one legacy request, prints the ms to its reply (or "none"). */
const QEMU = String.raw`
import os, socket, struct, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(float(sys.argv[2]))
t0 = time.monotonic()
step = "connect"
try:
    s.connect(sys.argv[1])
    step = "reply"
    s.sendall(struct.pack("<III", 0x606, 0, os.getpid()))
    d = s.recv(8)
    print("%.1f" % ((time.monotonic() - t0) * 1000) if len(d) == 8 else "none closed", flush=True)
except OSError as e:
    print("none " + step + " " + str(e), flush=True)
`;

const KVM_GID = (() => {
  const r = spawnSync('getent', ['group', 'kvm'], { encoding: 'utf8' });
  return r.status === 0 ? Number(r.stdout.split(':')[2]) : null;
})();

/** python3 under the name QEMU runs as, readable and executable by the QEMU uid. */
function qemuNamedPython(dir: string): string {
  const link = path.join(dir, 'qemu-system-x86_64');
  fs.symlinkSync(fs.realpathSync(PYTHON), link);
  return link;
}

function newQemuWaitMs(python: string, sock: string): Promise<number> {
  return new Promise((resolve) => {
    const p = spawn(python, ['-c', QEMU, sock, String(REPLY_DEADLINE_MS / 1000)], {
      uid: QEMU_UID,
      gid: KVM_GID!,
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    p.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    p.on('exit', () => {
      const n = Number(out.trim());
      if (!Number.isFinite(n) || out.trim() === '') console.log(`a new QEMU was not answered: ${out.trim() || 'no output'}`);
      resolve(Number.isFinite(n) && out.trim() !== '' ? n : Infinity);
    });
  });
}

async function attack(mode: 'legacy' | 'v2idle' | 'statsfd', n: number) {
  const { host, sock } = fakeHost();
  fs.chmodSync(path.dirname(sock), 0o755);
  const daemon = track(
    await startHelper([
      '-k',
      sock,
      '-u',
      'nobody',
      '--socket-mode',
      '0660',
      '--socket-group',
      'kvm',
      '--max-connections',
      String(MAX_CONNECTIONS),
      ...hostArgs(host),
    ]),
  );
  const attacker = spawn(PYTHON, ['-u', '-c', ATTACKER, sock, mode, String(n)], {
    uid: ATTACKER_UID,
    gid: KVM_GID!,
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  onCleanup(() => void attacker.kill('SIGKILL'));
  let status = '';
  attacker.stdout!.on('data', (d: Buffer) => {
    const last = d.toString().trim().split('\n').at(-1);
    if (last) status = last;
  });
  const dir = tempDir('vmsr-qemu-name-');
  fs.chmodSync(dir, 0o755);
  onCleanup(() => fs.rmSync(dir, { recursive: true, force: true }));
  const python = qemuNamedPython(dir);
  await sleep(3000); // the attacker takes every slot it can
  const waits: number[] = [];
  for (let i = 0; i < NEW_QEMUS; i++) {
    waits.push(await newQemuWaitMs(python, sock));
    await sleep(200);
  }
  const sorted = [...waits].sort((a, b) => a - b);
  console.log(
    `${mode} x ${n} by uid ${ATTACKER_UID} (${status}): new QEMU answered in ${waits.map((w) => w.toFixed(1)).join(', ')} ms; median ${sorted[NEW_QEMUS >> 1]!.toFixed(1)} ms, ` +
      `${waits.filter((w) => w < 500).length} of ${NEW_QEMUS} within the 0.5 s goal`,
  );
  return { daemon, sock, waits, status };
}

function skipWhy(): string | null {
  return notRoot() ?? (KVM_GID === null ? 'no kvm group on this host' : null) ?? (os.userInfo().uid === 0 ? null : 'needs root');
}

describe("the socket's group locking QEMU out", () => {
  for (const [mode, n] of [
    ['legacy', MAX_CONNECTIONS + 50],
    ['v2idle', MAX_CONNECTIONS + 50],
    ['statsfd', 400],
  ] as const) {
    test(`every new QEMU connection is answered while another uid of --socket-group holds ${n} ${mode} connections`, async (ctx) => {
      const why = skipWhy();
      if (why) return ctx.skip(why);
      const { daemon, sock, waits, status } = await attack(mode, n);
      // The attack ran: the attacker held connections (legacy ones answered) while QEMU connected.
      expect(status, 'the attacker reported nothing').toMatch(/^open \d+ answered \d+$/);
      if (mode === 'legacy') expect(Number(/answered (\d+)/.exec(status)![1])).toBeGreaterThan(MAX_CONNECTIONS / 8);
      expect(
        waits.filter((w) => !(w < REPLY_DEADLINE_MS)),
        `new QEMUs not answered within ${REPLY_DEADLINE_MS} ms`,
      ).toEqual([]);
      // Root's connection still gets in, and the daemon is well.
      const root = await LegacyClient.connect(sock);
      onCleanup(() => root.close());
      expect(await root.request(0x606, 0, process.pid)).toBe(0xa1003n);
      expect(daemon.proc.exitCode).toBeNull();
    }, 120_000);
  }
});
