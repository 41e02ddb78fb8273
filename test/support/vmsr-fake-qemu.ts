/**
 * A fake QEMU for exact mode's attacks (test/hostile/): a python3 copy whose executable carries QEMU
 * 10.0.2's version string (so the helper reads a modelled version from /proc/<pid>/exe), argv[0],
 * comm and vCPU thread names as QEMU's, and a vmsr thread that asks the helper for
 * MSR_PKG_ENERGY_STATUS exactly as QEMU's `kvm_msr_energy_thread` does (list its threads and read
 * their ticks, ask per package, sleep 1 s, ask again, read the ticks again) and credits its
 * virtual packages with QEMU's arithmetic (src/guest-energy/qemu-vmsr-loop.ts, in double and u64 as
 * the C). Each window it appends `w <n> <credited> <counter per virtual package...>` to a log file.
 * On stdin: `spin N`, `idle N`, `add N` (vCPU N), `churn S` (a thread that runs 0.2 s and ends S seconds after it began).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { PYTHON } from './fake-qemu.js';

const SCRIPT = String.raw`
import ctypes, math, os, socket, struct, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def setname(n): libc.prctl(15, ctypes.c_char_p(n.encode()[:15]), 0, 0, 0)
setname("qemu-system-x86")
if os.environ.get("FAKE_UNDUMPABLE") == "1": libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: /proc/<pid>/exe closed to its own uid too
CLK = os.sysconf("SC_CLK_TCK")
SOCKETS = int(os.environ["FAKE_SOCKETS"]); PER = int(os.environ["FAKE_PER_SOCKET"])
PKG = {}
for c in range(os.cpu_count()):
    with open("/sys/devices/system/cpu/cpu%d/topology/physical_package_id" % c) as f: PKG[c] = int(f.read())
MAXT = {p: CLK * sum(1 for q in PKG.values() if q == p) for p in set(PKG.values())}
vcpus = {}
class Vcpu:
    def __init__(self, i):
        self.i = i; self.spin = False; self.wake = threading.Event(); self.ready = threading.Event()
        threading.Thread(target=self.run, daemon=True).start(); self.ready.wait()
    def run(self):
        setname("CPU %d/KVM" % self.i); self.tid = threading.get_native_id(); self.ready.set()
        while True:
            if self.spin:
                x = 0
                for _ in range(20000): x += 1
            else:
                self.wake.wait(); self.wake.clear()
def churn(life):
    end = time.monotonic() + 0.2
    while time.monotonic() < end: pass
    time.sleep(max(0.0, life - 0.2))
def stat(tid):
    try:
        with open("/proc/self/task/%d/stat" % tid) as f: s = f.read()
    except OSError: return None
    r = s[s.rindex(")") + 2:].split()
    return int(r[11]) + int(r[12]), int(r[36])
U64 = 1 << 64
def lround(x): return 1 << 63 if not x < 2.0 ** 63 else int(math.floor(x + 0.5))
def ratio(e, d, m): return (float(e) / 100.0) * ((100.0 / m) * float(d))
def vmsr():
    log = open(os.environ["FAKE_VMSR_LOG"], "a", buffering=1)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(os.environ["FAKE_VMSR_SOCKET"]); s.settimeout(60)
    me = threading.get_native_id(); main = os.getpid()
    def ask(cpu):
        s.sendall(struct.pack("<III", 0x611, cpu, me)); b = b""
        while len(b) < 8:
            c = s.recv(8 - len(b))
            if not c: raise EOFError("closed")
            b += c
        return struct.unpack("<Q", b)[0]
    e_ratio = {}; nb = {}; counters = [0] * SOCKETS; n = 0
    while True:
        tids = [int(t) for t in os.listdir("/proc/self/task") if int(t) != main]
        start = {}
        for t in tids:
            st = stat(t); start[t] = st if st is not None else (0, 0)
        asked = {}
        for t, (_, cpu) in start.items(): asked.setdefault(PKG[cpu], cpu)
        e0 = {p: ask(c) for p, c in asked.items()}
        time.sleep(1)
        e1 = {p: ask(c) for p, c in asked.items()}
        delta = {}
        for t in tids:
            st = stat(t); delta[t] = ((st[0] if st is not None else 0) - start[t][0]) % U64
        ed = {p: (e1[p] - e0[p]) if e1[p] > e0[p] else 0 for p in asked}
        vc = {v.tid: i // PER for i, v in list(vcpus.items())}
        for t in tids:
            if t in vc: p = PKG[start[t][1]]; nb[p] = (nb.get(p, 0) + 1) % (1 << 32)
        for t in tids:
            if t in vc or delta[t] == 0: continue
            p = PKG[start[t][1]]; e_ratio[p] = (e_ratio.get(p, 0) + lround(ratio(ed.get(p, 0), delta[t], MAXT[p]))) % U64
        for p in nb:
            if nb[p] > 0: e_ratio[p] = e_ratio.get(p, 0) // nb[p]
        credited = 0
        for t in tids:
            if t not in vc or delta[t] == 0: continue
            p = PKG[start[t][1]]; add = lround(ratio(ed.get(p, 0), delta[t], MAXT[p])) + e_ratio.get(p, 0)
            counters[vc[t]] = (counters[vc[t]] + add) % (1 << 32); credited += add
        n += 1
        log.write("w %d %d %s\n" % (n, credited, " ".join(map(str, counters))))
for i in range(int(os.environ["FAKE_VCPUS"])): vcpus[i] = Vcpu(i)
threading.Thread(target=vmsr, daemon=True).start()
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd: continue
    if cmd[0] == "churn": threading.Thread(target=churn, args=(float(cmd[1]),), daemon=True).start()
    elif cmd[0] == "add": vcpus[int(cmd[1])] = Vcpu(int(cmd[1]))
    elif cmd[0] == "spin": vcpus[int(cmd[1])].spin = True; vcpus[int(cmd[1])].wake.set()
    elif cmd[0] == "idle": vcpus[int(cmd[1])].spin = False
    print("ok", flush=True)
`;

/** The executable: python3, copied into `dir` with QEMU's version string appended (an ELF runs with trailing bytes). */
export function markedQemuExe(dir: string, version = '10.0.2'): string {
  const exe = path.join(dir, 'qemu-system-x86_64');
  fs.copyFileSync(fs.realpathSync(PYTHON), exe);
  fs.appendFileSync(exe, `\0QEMU emulator version ${version} (fake)\0`);
  fs.chmodSync(exe, 0o755);
  return exe;
}

/** One window as the fake QEMU's vmsr loop closed it. */
export interface FakeWindow {
  n: number;
  /** Units it credited its virtual packages in the window. */
  credited: number;
  counters: number[];
}

export class VmsrFakeQemu {
  readonly child: ChildProcess;
  readonly log: string;
  private out = '';

  /** `exe` from markedQemuExe; `sockets` x `perSocket` vCPUs in -smp, `vcpus` of them started; as `uid` when given. */
  /** `undumpable`: its /proc/<pid>/exe closed to every other process but root's. */
  constructor(o: {
    exe: string;
    socket: string;
    logDir: string;
    sockets: number;
    perSocket: number;
    vcpus: number;
    uid?: number;
    argv0?: string;
    undumpable?: boolean;
  }) {
    this.log = path.join(o.logDir, `vmsr-${Date.now()}-${Math.random().toString(36).slice(2)}.log`);
    fs.writeFileSync(this.log, '');
    fs.chmodSync(this.log, 0o666);
    const smp = `${o.sockets * o.perSocket},sockets=${o.sockets},cores=${o.perSocket},threads=1`;
    this.child = spawn(o.exe, ['-u', '-c', SCRIPT, '-name', 'guest=fake', '-smp', smp], {
      argv0: o.argv0 ?? 'qemu-system-x86_64',
      stdio: ['pipe', 'pipe', 'inherit'],
      cwd: '/',
      env: {
        PATH: process.env.PATH ?? '/usr/bin:/bin',
        FAKE_SOCKETS: String(o.sockets),
        FAKE_PER_SOCKET: String(o.perSocket),
        FAKE_VCPUS: String(o.vcpus),
        FAKE_VMSR_SOCKET: o.socket,
        FAKE_VMSR_LOG: this.log,
        FAKE_UNDUMPABLE: o.undumpable === true ? '1' : '0',
      },
      ...(o.uid !== undefined ? { uid: o.uid, gid: o.uid } : {}),
    });
    this.child.stdout!.setEncoding('utf8');
    this.child.stdout!.on('data', (d: string) => (this.out += d));
  }

  get pid(): number {
    return this.child.pid!;
  }

  alive(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  private async line(n: number, what: string): Promise<void> {
    const end = Date.now() + 60_000;
    while (this.out.split('\n').length - 1 < n) {
      if (!this.alive()) throw new Error(`the fake QEMU exited waiting for ${what}`);
      if (Date.now() > end) throw new Error(`the fake QEMU did not answer ${what} in 60 s`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  async ready(): Promise<this> {
    await this.line(1, 'ready');
    return this;
  }

  /** spin N | idle N | add N | churn S */
  async cmd(c: string): Promise<void> {
    const n = this.out.split('\n').length;
    this.child.stdin!.write(`${c}\n`);
    await this.line(n, c);
  }

  windows(): FakeWindow[] {
    return fs
      .readFileSync(this.log, 'utf8')
      .split('\n')
      .filter((l) => l.startsWith('w '))
      .map((l) => {
        const [, n, credited, ...counters] = l.split(' ').map(Number);
        return { n: n!, credited: credited!, counters };
      });
  }

  /** Waits (up to `ms`, far above the ~1 s a window takes) until the fake closed `n` windows in all. */
  async windowsClosed(n: number, ms = 120_000): Promise<FakeWindow[]> {
    const end = Date.now() + ms;
    for (;;) {
      const w = this.windows();
      if (w.length >= n) return w;
      if (!this.alive()) throw new Error(`the fake QEMU exited after ${w.length} of ${n} windows`);
      if (Date.now() > end) throw new Error(`the fake QEMU closed ${w.length} of ${n} windows in ${ms} ms: its requests went unanswered`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  async kill(): Promise<void> {
    if (!this.alive()) return;
    const done = new Promise((r) => this.child.once('exit', r));
    this.child.kill('SIGKILL');
    await done;
  }
}
