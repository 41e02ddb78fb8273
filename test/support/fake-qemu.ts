/**
 * Processes that look like QEMU to /proc without being QEMU: python3 with argv[0] and comm of our
 * choosing and threads renamed (prctl PR_SET_NAME) to `CPU <n>/KVM`. Used where a real QEMU cannot
 * give what a test needs (hundreds of VMs for the bench, a vCPU hotplugged on command, a process
 * that only pretends). Real QEMU tests use test/support/qemu.ts.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import { LineReader } from './line-reader.js';

/** The real interpreter: a pyenv shim is a shell script and would change argv[0] and comm. */
export const PYTHON = fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

const COMMON = String.raw`
import ctypes, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
def setname(n):
    libc.prctl(15, ctypes.c_char_p(n.encode()[:15]), 0, 0, 0)
`;

const VM_SCRIPT =
  COMMON +
  String.raw`
comm = os.environ.get("FAKE_COMM", "")
named = os.environ.get("FAKE_VCPU_NAMES", "1") == "1"
vcpus = {}
class Vcpu:
    def __init__(self, i):
        self.i = i; self.spin = False; self.wake = threading.Event(); self.stop = False
        self.ready = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True); self.t.start(); self.ready.wait()
    def run(self):
        if named: setname("CPU %d/KVM" % self.i)
        elif comm: setname(comm)
        self.tid = threading.get_native_id(); self.ready.set()
        while not self.stop:
            if self.spin:
                x = 0
                for _ in range(20000): x += 1
            else:
                self.wake.wait(); self.wake.clear()
for i in range(int(os.environ.get("FAKE_VCPUS", "0"))): vcpus[i] = Vcpu(i)
# QEMU's name once the vCPU threads carry theirs: discovery never sees a QEMU-named python with its
# vCPU threads not yet named (its executable is not QEMU's, so it would be judged not a VM).
if comm: setname(comm)
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd: continue
    i = int(cmd[1]) if len(cmd) > 1 else -1
    if cmd[0] == "spin": vcpus[i].spin = True; vcpus[i].wake.set()
    elif cmd[0] == "idle": vcpus[i].spin = False
    elif cmd[0] == "add": vcpus[i] = Vcpu(i)
    elif cmd[0] == "del":
        v = vcpus.pop(i); v.stop = True; v.wake.set(); v.t.join()
    print("ok %s" % " ".join("%d:%d" % (k, v.tid) for k, v in sorted(vcpus.items())), flush=True)
`;

export interface FakeQemuOptions {
  /** argv[0]; default qemu-system-x86_64. */
  argv0?: string;
  /** Main thread's name (comm); default qemu-system-x86 (what QEMU's comm looks like). '' keeps python's. */
  comm?: string;
  /** vCPU threads at start. */
  vcpus: number;
  /** Name vCPU threads `CPU <n>/KVM` (debug-threads=on); default true. */
  vcpuNames?: boolean;
  /** QEMU-like arguments appended after the script (-name, -uuid, -smp ...). */
  args?: string[];
}

export class FakeQemu {
  readonly child: ChildProcess;
  private readonly out: LineReader;
  /** vCPU index -> tid, as of the last command. */
  vcpuTids = new Map<number, number>();

  constructor(o: FakeQemuOptions, spawnOpts: { uid?: number; gid?: number } = {}) {
    this.child = spawn(PYTHON, ['-u', '-c', VM_SCRIPT, ...(o.args ?? [])], {
      argv0: o.argv0 ?? 'qemu-system-x86_64',
      stdio: ['pipe', 'pipe', 'inherit'],
      env: {
        ...process.env,
        FAKE_COMM: o.comm ?? 'qemu-system-x86',
        FAKE_VCPUS: String(o.vcpus),
        FAKE_VCPU_NAMES: o.vcpuNames === false ? '0' : '1',
      },
      ...spawnOpts,
    });
    this.out = new LineReader(this.child);
  }

  get pid(): number {
    return this.child.pid!;
  }

  private nextLine(): Promise<string> {
    return this.out.next();
  }

  async ready(): Promise<this> {
    const l = await this.nextLine();
    if (l !== 'ready') throw new Error(`fake QEMU said ${l}`);
    await this.cmd('list');
    return this;
  }

  /** spin N | idle N | add N | del N | list */
  async cmd(c: string): Promise<void> {
    this.child.stdin!.write(`${c}\n`);
    const l = await this.nextLine();
    this.vcpuTids = new Map(
      l
        .slice(3)
        .split(' ')
        .filter(Boolean)
        .map((p) => p.split(':').map(Number) as [number, number]),
    );
  }

  async kill(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const done = new Promise((r) => this.child.once('exit', r));
    this.child.kill('SIGKILL');
    await done;
  }
}

const FARM_SCRIPT =
  COMMON +
  String.raw`
n = int(sys.argv[1]); nv = int(sys.argv[2]); first = int(os.environ.get("FAKE_FIRST_VCPU", "0"))
wake = float(os.environ.get("FAKE_WAKE_S", "0")) or None
pids = []
r, w = os.pipe()
for k in range(n):
    pid = os.fork()
    if pid == 0:
        os.close(w)
        evs = []
        def vcpu(i, ev, named):
            setname("CPU %d/KVM" % i); named.set()
            while not ev.wait(wake): pass
        for i in range(first, first + nv):
            ev = threading.Event(); named = threading.Event()
            threading.Thread(target=vcpu, args=(i, ev, named), daemon=True).start(); evs.append(ev); named.wait()
        setname("qemu-system-x86")  # once the vCPU threads carry their names (as in the VM script)
        os.read(r, 1)  # returns when the farm's parent dies
        os._exit(0)
    pids.append(pid)
os.close(r)
print(" ".join(map(str, pids)), flush=True)
sys.stdin.read()
`;

/**
 * `count` fake VMs of `vcpus` named vCPU threads each, forked from one python (pages shared). The
 * vCPU threads sleep for good, or with `wakeEveryMs` wake that often (as an idle guest's vCPUs do
 * for its timers) and sleep again. `firstVcpu` numbers the threads from there (`CPU <first>/KVM`
 * on); `args` replaces the QEMU-like arguments (`-name guest=farm -smp <vcpus>,sockets=2`); `uid`
 * runs the farm as that user, and `gid` (default: the same number) as that group.
 */
export class FakeQemuFarm {
  readonly child: ChildProcess;
  pids: number[] = [];

  constructor(
    readonly count: number,
    readonly vcpus: number,
    o: { wakeEveryMs?: number; firstVcpu?: number; args?: string[]; uid?: number; gid?: number } = {},
  ) {
    const args = o.args ?? ['-name', 'guest=farm', '-smp', `${vcpus},sockets=2`];
    this.child = spawn(PYTHON, ['-u', '-c', FARM_SCRIPT, String(count), String(vcpus), ...args], {
      argv0: 'qemu-system-x86_64',
      stdio: ['pipe', 'pipe', 'inherit'],
      env: { ...process.env, FAKE_WAKE_S: String((o.wakeEveryMs ?? 0) / 1000), FAKE_FIRST_VCPU: String(o.firstVcpu ?? 0) },
      ...(o.uid !== undefined ? { uid: o.uid, gid: o.gid ?? o.uid, cwd: '/' } : {}),
    });
  }

  async ready(timeoutMs = 120_000): Promise<number[]> {
    if (this.count === 0) return [];
    const line = await new Promise<string>((resolve, reject) => {
      let buf = '';
      const t = setTimeout(() => reject(new Error('fake QEMU farm did not start in time')), timeoutMs);
      this.child.stdout!.setEncoding('utf8');
      this.child.stdout!.on('data', (d: string) => {
        buf += d;
        const i = buf.indexOf('\n');
        if (i >= 0) {
          clearTimeout(t);
          resolve(buf.slice(0, i));
        }
      });
      this.child.once('exit', () => reject(new Error('fake QEMU farm exited')));
    });
    this.pids = line.split(' ').map(Number);
    // A child has named all its threads once it carries QEMU's name (it takes it last).
    const deadline = Date.now() + timeoutMs;
    for (const pid of this.pids) {
      while (fs.readFileSync(`/proc/${pid}/comm`, 'utf8').trimEnd() !== 'qemu-system-x86') {
        if (Date.now() > deadline) throw new Error(`farm child ${pid} did not name its vCPU threads and itself qemu-system-x86 in time`);
        await new Promise((r) => setTimeout(r, 10));
      }
    }
    return this.pids;
  }

  async kill(): Promise<void> {
    for (const pid of this.pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const done = new Promise((r) => this.child.once('exit', r));
      this.child.kill('SIGKILL');
      await done;
    }
  }
}
