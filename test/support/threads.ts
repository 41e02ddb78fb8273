/**
 * A real python3 process whose threads the test starts and stops through stdin: `start N` / `stop N`
 * sleeping threads (`start N busy`: each uses 30 ms of CPU first, so that it has ticks), `spin` (a thread that never sleeps), `burner` (a thread that sleeps until each
 * `burn`, then uses 50 ms of CPU; `burn` answers once /proc shows it asleep again).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import { LineReader } from './line-reader.js';
import { PYTHON } from './fake-qemu.js';

const SCRIPT = `
import sys, threading, time
evs = []
burn_go = threading.Event()
burn_done = threading.Event()
burner_tid = [0]
def burner():
    burner_tid[0] = threading.get_native_id()
    while True:
        burn_go.wait(); burn_go.clear()
        end = time.thread_time() + 0.05
        while time.thread_time() < end: pass
        burn_done.set()
def worker(ev, busy, burnt):
    end = time.thread_time() + busy
    while time.thread_time() < end: pass
    burnt.set()
    ev.wait()
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd: continue
    if cmd[0] == "start":
        for _ in range(int(cmd[1])):
            ev = threading.Event(); burnt = threading.Event()
            t = threading.Thread(target=worker, args=(ev, 0.03 if cmd[2:] == ["busy"] else 0, burnt)); t.start(); evs.append((ev, t)); burnt.wait()
    elif cmd[0] == "stop":
        for _ in range(int(cmd[1])):
            ev, t = evs.pop(); ev.set(); t.join()
    elif cmd[0] == "burner":
        threading.Thread(target=burner, daemon=True).start()
    elif cmd[0] == "burn":
        burn_done.clear(); burn_go.set(); burn_done.wait()
        while open("/proc/self/task/%d/stat" % burner_tid[0]).read().rsplit(")", 1)[1].split()[0] != "S": time.sleep(0.001)
    elif cmd[0] == "spin":
        def s():
            x = 0
            while True: x += 1
        threading.Thread(target=s, daemon=True).start()
    print("ok", flush=True)
`;

export class ThreadedProcess {
  readonly child: ChildProcess;
  private readonly out: LineReader;

  /** `uid`/`gid`: run as that user (then with /usr/bin/python3: the PATH one may be a shim other users cannot run). */
  constructor(o: { uid?: number; gid?: number } = {}) {
    this.child =
      o.uid === undefined
        ? spawn('python3', ['-u', '-c', SCRIPT], { stdio: ['pipe', 'pipe', 'inherit'] })
        : spawn(PYTHON, ['-u', '-c', SCRIPT], { stdio: ['pipe', 'pipe', 'inherit'], uid: o.uid, gid: o.gid ?? o.uid });
    this.out = new LineReader(this.child);
  }

  get pid(): number {
    return this.child.pid!;
  }

  private nextLine(): Promise<string> {
    return this.out.next();
  }

  async ready(): Promise<void> {
    await this.nextLine();
  }

  async cmd(c: string): Promise<void> {
    const stop = /^stop (\d+)$/.exec(c);
    const target = stop ? this.tids().length - Number(stop[1]) : undefined;
    this.child.stdin!.write(`${c}\n`);
    await this.nextLine();
    // Python's join() returns before the OS thread is gone from /proc: wait for the kernel to catch up.
    const deadline = Date.now() + 5000;
    while (target !== undefined && this.tids().length > target) {
      if (Date.now() > deadline) throw new Error(`${c}: threads still listed in /proc/${this.pid}/task after 5 s`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  tids(): number[] {
    return fs
      .readdirSync(`/proc/${this.pid}/task`)
      .map(Number)
      .sort((a, b) => a - b);
  }

  async kill(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const done = new Promise((r) => this.child.once('exit', r));
    this.child.kill('SIGKILL');
    await done;
  }
}

export function openFdCount(): number {
  return fs.readdirSync('/proc/self/fd').length;
}

/** Our open fds that point into /proc/<pid>/ (what a ProcTaskReader holds for that pid). */
export function procFdsOf(pid: number): number {
  let n = 0;
  for (const fd of fs.readdirSync('/proc/self/fd')) {
    try {
      if (fs.readlinkSync(`/proc/self/fd/${fd}`).startsWith(`/proc/${pid}/`)) n++;
    } catch {
      /* closed meanwhile */
    }
  }
  return n;
}
