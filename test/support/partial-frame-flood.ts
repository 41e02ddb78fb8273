/**
 * A flood of connections that each send the v2 magic and part of a frame, then wait: one python3
 * process (`uid` when given: a real process of another user) opens `connections` of them on the
 * helper's socket and reopens each as soon as the helper closes it (a timeout, an eviction, a
 * refusal), for as long as it runs. What a user of the socket's group can do to hold the helper's
 * incomplete-frame budget and its connection slots. Stops when its stdin closes.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { PYTHON } from './fake-qemu.js';
import { LineReader } from './line-reader.js';

const FLOOD_SCRIPT = String.raw`
import errno, os, resource, selectors, socket, struct, sys, threading, time
path = sys.argv[1]; n = int(sys.argv[2]); body = int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n + 256)), hard))
# The v2 magic, a REGISTER header announcing 65,535 bytes, and 'body' of them: never a whole frame.
frame = b"VMS2" + struct.pack("<HHI", 1, 0, 65535) + b"\x55" * body
def watch():
    sys.stdin.read()
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
sel = selectors.DefaultSelector()
todo = {}  # socket -> bytes still to send
want = n
opened = 0
reopened = 0
def open_one():
    global opened
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        return False  # EAGAIN: the listen backlog is full; ECONNREFUSED: not listening
    opened += 1
    todo[s] = frame
    sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
    return True
def drop(s):
    global want, reopened
    sel.unregister(s)
    todo.pop(s, None)
    s.close()
    reopened += 1
live = lambda: len(sel.get_map())
ready = False
last = time.monotonic()
while True:
    while live() < want:
        if not open_one(): break
    if not ready and opened >= want:
        print("ready", flush=True); ready = True
    for key, ev in sel.select(0.005):
        s = key.fileobj
        if ev & selectors.EVENT_READ:
            try:
                d = s.recv(65536)
            except OSError:
                d = b""
            if not d:
                drop(s); continue
        if ev & selectors.EVENT_WRITE:
            rest = todo.get(s, b"")
            try:
                k = s.send(rest) if rest else 0
            except BlockingIOError:
                k = 0
            except OSError:
                drop(s); continue
            rest = rest[k:]
            if rest: todo[s] = rest
            else:
                todo.pop(s, None)
                sel.modify(s, selectors.EVENT_READ)
    now = time.monotonic()
    if now - last >= 1:
        print("open %d opened %d reopened %d" % (live(), opened, reopened), flush=True)
        last = now
`;

export interface PartialFrameFloodOptions {
  socketPath: string;
  /** Connections held at once. */
  connections: number;
  /** Bytes of the frame's payload each sends (of 65,535 announced). */
  bodyBytes: number;
  /** Run as this uid (and gid), e.g. nobody; default the caller's. */
  uid?: number;
}

export class PartialFrameFlood {
  readonly child: ChildProcess;
  private readonly out: LineReader;
  /** As last reported (once a second): connections open, opened in all, closed by the helper and reopened. */
  open = 0;
  opened = 0;
  reopened = 0;

  constructor(o: PartialFrameFloodOptions) {
    this.child = spawn(PYTHON, ['-u', '-c', FLOOD_SCRIPT, o.socketPath, String(o.connections), String(o.bodyBytes)], {
      stdio: ['pipe', 'pipe', 'inherit'],
      ...(o.uid !== undefined ? { uid: o.uid, gid: o.uid } : {}),
    });
    this.out = new LineReader(this.child);
  }

  /** Resolves once every connection was opened once (fails after `ms`); `open` and the rest follow its reports from then on. */
  async ready(ms = 60_000): Promise<this> {
    const deadline = Date.now() + ms;
    for (;;) {
      const l = await Promise.race([
        this.out.next(),
        new Promise<null>((r) => setTimeout(() => r(null), Math.max(0, deadline - Date.now()))),
      ]);
      if (l === null) throw new Error(`the partial-frame flood did not open its connections in ${ms} ms (open ${this.open})`);
      if (l === 'ready') break;
      this.report(l);
    }
    void (async () => {
      for (;;) {
        const line = await this.out.next().catch(() => null);
        if (line === null) return;
        this.report(line);
      }
    })();
    return this;
  }

  private report(line: string): void {
    const m = /^open (\d+) opened (\d+) reopened (\d+)$/.exec(line);
    if (!m) return;
    this.open = Number(m[1]);
    this.opened = Number(m[2]);
    this.reopened = Number(m[3]);
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const done = new Promise((r) => this.child.once('exit', r));
    this.child.stdin!.end();
    const t = setTimeout(() => this.child.kill('SIGKILL'), 2000);
    await done;
    clearTimeout(t);
  }
}
