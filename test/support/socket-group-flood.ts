/**
 * A second uid of `--socket-group` flooding the helper's connection slots while new QEMUs connect
 * (docs/security.md, "The socket's group locking QEMU out"): the daemon's options (dropped to -u nobody, socket root:kvm 0660, --max-connections
 * 300), the three floods, the attacker (a real python3 process of uid 65533 in kvm) and the new QEMUs
 * (real processes of uid 65532 in kvm named qemu-system-x86_64, as discovery and the daemon recognise
 * QEMU, a new one for each connection). test/hostile/socket-group-locks-out-no-qemu.test.ts checks
 * that every new QEMU is answered; bench/floods.ts measures how fast.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { PYTHON } from './fake-qemu.js';

export const ATTACKER_UID = 65533;
export const QEMU_UID = 65532;
export const MAX_CONNECTIONS = 300;

/**
 * `legacy`: one legacy request answered on each connection, then held; `v2idle`: the v2 magic, then
 * held; `statsfd`: the v2 magic and 4,096 STATS_FD requests pipelined, never read.
 */
export type FloodMode = 'legacy' | 'v2idle' | 'statsfd';

/** The floods of the finding: each mode with the connections the attacker keeps open. */
export const FLOODS: readonly (readonly [FloodMode, number])[] = [
  ['legacy', MAX_CONNECTIONS + 50],
  ['v2idle', MAX_CONNECTIONS + 50],
  ['statsfd', 400],
];

/** What the new QEMUs wait between two of them. */
const QEMU_GAP_MS = 200;
/** What the attacker is given to take every slot it can before the first new QEMU. */
const FLOOD_SETTLE_MS = 3000;

/**
 * The attacker: keeps `n` connections open, reopening each the daemon closes. Prints "open N
 * answered N" every 0.5 s. Stops when its stdin closes.
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
    sel.register(s, selectors.EVENT_READ)
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

/** A new QEMU: connects, sends one legacy request, prints the ms from connect() to its reply (or "none" and why). */
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

/** The kvm group's gid on this host, or null. */
export const KVM_GID = (() => {
  const r = spawnSync('getent', ['group', 'kvm'], { encoding: 'utf8' });
  return r.status === 0 ? Number(r.stdout.split(':')[2]) : null;
})();

/** Why the flood cannot run here (it needs root, a kvm group and python3), or null. */
export function floodUnavailable(): string | null {
  if (process.getuid?.() !== 0)
    return `needs root: the daemon drops to -u nobody, the attacker runs as uid ${ATTACKER_UID} and QEMU as uid ${QEMU_UID}`;
  if (KVM_GID === null) return 'no kvm group on this host (getent group kvm): the socket group the flood runs in';
  if (spawnSync(PYTHON, ['-c', '']).status !== 0) return `no python3 (${PYTHON}): the attacker and the new QEMUs are python3 scripts`;
  return null;
}

/** The daemon's options besides its socket and host: dropped to nobody, socket root:kvm 0660, 300 connections at most. */
export function floodDaemonArgs(): string[] {
  return ['-u', 'nobody', '--socket-mode', '0660', '--socket-group', 'kvm', '--max-connections', String(MAX_CONNECTIONS)];
}

/** The attacker running against `sock`, and the new QEMUs it is meant to lock out. */
export class SocketGroupFlood {
  /** The attacker's last "open N answered N". */
  status = '';

  private constructor(
    private readonly sock: string,
    private readonly attacker: ChildProcess,
    private readonly dir: string,
    private readonly qemuPython: string,
  ) {
    attacker.stdout!.on('data', (d: Buffer) => {
      const last = d.toString().trim().split('\n').at(-1);
      if (last) this.status = last;
    });
  }

  /** Starts `n` connections of `mode` on `sock` (its directory searchable by others) and gives them time to take every slot they can. */
  static async start(sock: string, mode: FloodMode, n: number): Promise<SocketGroupFlood> {
    const attacker = spawn(PYTHON, ['-u', '-c', ATTACKER, sock, mode, String(n)], {
      uid: ATTACKER_UID,
      gid: KVM_GID!,
      cwd: '/',
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-qemu-name-'));
    fs.chmodSync(dir, 0o755);
    // python3 under the name QEMU runs as, reachable by the QEMU uid.
    const qemuPython = path.join(dir, 'qemu-system-x86_64');
    fs.symlinkSync(fs.realpathSync(PYTHON), qemuPython);
    const flood = new SocketGroupFlood(sock, attacker, dir, qemuPython);
    await new Promise((r) => setTimeout(r, FLOOD_SETTLE_MS));
    return flood;
  }

  /** One new QEMU's ms from connect() to its reply; Infinity (and a line saying why) when none came within `deadlineMs`. */
  newQemuWaitMs(deadlineMs: number): Promise<number> {
    return new Promise((resolve) => {
      const p = spawn(this.qemuPython, ['-c', QEMU, this.sock, String(deadlineMs / 1000)], {
        uid: QEMU_UID,
        gid: KVM_GID!,
        cwd: '/',
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      let out = '';
      p.stdout!.on('data', (d: Buffer) => (out += d.toString()));
      p.on('exit', () => {
        const n = Number(out.trim());
        const answered = out.trim() !== '' && Number.isFinite(n);
        if (!answered) console.log(`a new QEMU was not answered: ${out.trim() || 'no output'}`);
        resolve(answered ? n : Infinity);
      });
    });
  }

  /** `count` new QEMUs one after the other, QEMU_GAP_MS apart: each one's wait, as newQemuWaitMs. */
  async newQemuWaits(count: number, deadlineMs: number): Promise<number[]> {
    const waits: number[] = [];
    for (let i = 0; i < count; i++) {
      waits.push(await this.newQemuWaitMs(deadlineMs));
      await new Promise((r) => setTimeout(r, QEMU_GAP_MS));
    }
    return waits;
  }

  stop(): void {
    this.attacker.kill('SIGKILL');
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}
