/**
 * A storm of short-lived processes that look like QEMU to /proc: one python3 (argv[0]
 * qemu-system-x86_64, a QEMU-like command line) forks `perSecond` children a second, each named
 * qemu-system-x86 with `vcpus` threads named `CPU <n>/KVM`, living `lifeMs` and exiting. What a
 * local user can do to make discovery look at (and admit, and drop) hundreds of VMs a second.
 * Runs as `uid` when given (a real process of another user). Stops when its stdin closes.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { PYTHON } from './fake-qemu.js';
import { LineReader } from './line-reader.js';

const STORM_SCRIPT = String.raw`
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def setname(n):
    libc.prctl(15, ctypes.c_char_p(n.encode()[:15]), 0, 0, 0)
rate = float(sys.argv[1]); life = float(sys.argv[2]); nv = int(sys.argv[3])
def watch():
    sys.stdin.read()
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
print("ready", flush=True)
started = 0
step = 1.0 / rate
due = time.monotonic()
last_report = due
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] != 0: pass
    except ChildProcessError:
        pass
    pid = os.fork()
    if pid == 0:
        setname("qemu-system-x86")
        def vcpu(i):
            setname("CPU %d/KVM" % i)
            time.sleep(life)
        for i in range(nv): threading.Thread(target=vcpu, args=(i,), daemon=True).start()
        time.sleep(life)
        os._exit(0)
    started += 1
    due += step
    now = time.monotonic()
    if now - last_report >= 1:
        print("started %d" % started, flush=True)
        last_report = now
    if due > now: time.sleep(due - now)
    elif now - due > 1: due = now  # far behind (a busy machine): no burst to catch up
`;

export interface ProcessStormOptions {
  /** Processes started a second. */
  perSecond: number;
  /** How long each lives, ms. */
  lifeMs: number;
  /** Threads named `CPU <n>/KVM` in each. */
  vcpus: number;
  /** Run as this uid (and gid), e.g. nobody; default the caller's. */
  uid?: number;
}

export class ProcessStorm {
  readonly child: ChildProcess;
  private readonly out: LineReader;
  /** Processes started, as last reported (once a second). */
  started = 0;

  constructor(o: ProcessStormOptions) {
    this.child = spawn(
      PYTHON,
      [
        '-u',
        '-c',
        STORM_SCRIPT,
        String(o.perSecond),
        String(o.lifeMs / 1000),
        String(o.vcpus),
        '-name',
        'guest=storm',
        '-smp',
        String(o.vcpus),
      ],
      {
        argv0: 'qemu-system-x86_64',
        stdio: ['pipe', 'pipe', 'inherit'],
        ...(o.uid !== undefined ? { uid: o.uid, gid: o.uid } : {}),
      },
    );
    this.out = new LineReader(this.child);
  }

  /** Resolves once the storm runs; from then on `started` follows its reports. */
  async ready(): Promise<this> {
    const l = await this.out.next();
    if (l !== 'ready') throw new Error(`process storm said ${l}`);
    void (async () => {
      for (;;) {
        const line = await this.out.next().catch(() => null);
        if (line === null) return;
        const m = /^started (\d+)$/.exec(line);
        if (m) this.started = Number(m[1]);
      }
    })();
    return this;
  }

  /** Stops starting processes (the last ones end by themselves within lifeMs). */
  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const done = new Promise((r) => this.child.once('exit', r));
    this.child.stdin!.end();
    const t = setTimeout(() => this.child.kill('SIGKILL'), 2000);
    await done;
    clearTimeout(t);
  }
}
