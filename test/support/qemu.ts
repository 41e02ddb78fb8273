/**
 * Real QEMU guests for tests: qemu-system-x86_64 running test/fixtures/guest/spin.elf, which keeps
 * chosen vCPUs busy (mode a/b/p/i, see its README). KVM when /dev/kvm is usable, else multi-threaded
 * TCG. Every guest started here is killed when the test ends (stop(), or the process exit hook).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { hasKvm, which } from './env.js';

export const SPIN_ELF = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../fixtures/guest/spin.elf');

export type GuestMode = 'a' | 'b' | 'p' | 'i';

export interface QemuOptions {
  /** a = every vCPU spins, b = boot vCPU spins, p = the others spin, i = all halt. */
  mode: GuestMode;
  /** vCPUs; default 2. */
  smp?: number;
  /** Virtual sockets (= virtual packages); default 1. smp must be a multiple of it. */
  sockets?: number;
  name?: string;
  /** Directory for the QMP socket and log; default a fresh temp dir removed by stop(). */
  dir?: string;
  /** Force TCG even where KVM is usable. */
  tcg?: boolean;
  /** How long to wait for the QMP socket to accept; default 15 s. */
  timeoutMs?: number;
  /** Plain QEMU: no -name and no debug-threads (every thread named like the process). */
  plain?: boolean;
  /** More arguments (e.g. -uuid). */
  extraArgs?: string[];
}

export interface QemuGuest {
  pid: number;
  qmpPath: string;
  name: string;
  accel: 'kvm' | 'tcg';
  child: ChildProcess;
  /** Resolves when the process has exited (any cause). */
  exited: Promise<void>;
  /** SIGKILL and wait for exit; removes the temp dir it made. Safe to call twice. */
  stop(): Promise<void>;
}

/** Why QEMU guests cannot run here, or null. */
export function qemuMissing(): string | null {
  if (!which('qemu-system-x86_64')) return 'qemu-system-x86_64 not installed (apt-get install qemu-system-x86)';
  if (!fs.existsSync(SPIN_ELF)) return `guest kernel ${SPIN_ELF} missing (make -C test/fixtures/guest)`;
  return null;
}

const live = new Set<ChildProcess>();
let hooked = false;
function hookExit(): void {
  if (hooked) return;
  hooked = true;
  // Last resort if a test forgets stop() or the worker dies: never leave a QEMU behind.
  process.on('exit', () => {
    for (const c of live) {
      try {
        c.kill('SIGKILL');
      } catch {
        /* gone */
      }
    }
  });
}

/** Whether a Unix socket at `p` accepts a connection now. */
export function canConnect(p: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(p);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

export async function startQemu(o: QemuOptions): Promise<QemuGuest> {
  const why = qemuMissing();
  if (why) throw new Error(why);
  const smp = o.smp ?? 2;
  const sockets = o.sockets ?? 1;
  if (smp % sockets !== 0) throw new Error(`smp ${smp} is not a multiple of sockets ${sockets}`);
  const ownDir = o.dir === undefined;
  const dir = o.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-qemu-'));
  const name = o.name ?? `vm-${o.mode}-${process.pid}-${Math.floor(Math.random() * 1e6)}`;
  const qmpPath = path.join(dir, `${name}.qmp`);
  const accel: 'kvm' | 'tcg' = !o.tcg && hasKvm() ? 'kvm' : 'tcg';
  const args = [
    '-accel',
    accel === 'kvm' ? 'kvm' : 'tcg,thread=multi',
    '-smp',
    `${smp},sockets=${sockets},cores=${smp / sockets},threads=1`,
    '-m',
    '64',
    '-nodefaults',
    '-display',
    'none',
    '-kernel',
    SPIN_ELF,
    '-append',
    `mode=${o.mode}`,
    ...(o.plain ? [] : ['-name', `${name},debug-threads=on`]),
    '-qmp',
    `unix:${qmpPath},server=on,wait=off`,
    ...(o.extraArgs ?? []),
  ];
  const child = spawn('qemu-system-x86_64', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  live.add(child);
  hookExit();
  let stderr = '';
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (d: string) => {
    if (stderr.length < 8192) stderr += d;
  });
  let exitedFlag = false;
  const exited = new Promise<void>((resolve) => {
    child.once('exit', () => {
      exitedFlag = true;
      live.delete(child);
      resolve();
    });
    child.once('error', () => {
      exitedFlag = true;
      live.delete(child);
      resolve();
    });
  });
  let stopped = false;
  const stop = async (): Promise<void> => {
    if (!stopped) {
      stopped = true;
      if (!exitedFlag) child.kill('SIGKILL');
      await exited;
      if (ownDir) fs.rmSync(dir, { recursive: true, force: true });
    }
  };
  const deadline = Date.now() + (o.timeoutMs ?? 15_000);
  for (;;) {
    if (exitedFlag) {
      await stop();
      throw new Error(`qemu-system-x86_64 exited before its QMP socket was ready: ${stderr.trim() || '(no stderr)'}`);
    }
    if (fs.existsSync(qmpPath) && (await canConnect(qmpPath))) break;
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`QMP socket ${qmpPath} not ready in time; qemu stderr: ${stderr.trim() || '(none)'}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  if (child.pid === undefined) throw new Error('qemu-system-x86_64 has no pid');
  // QEMU opens its QMP socket before it creates the vCPU threads: callers list those threads at once.
  // Plain QEMU (no debug-threads) has no named vCPU threads to wait for.
  while (!o.plain && vcpuThreads(child.pid).filter((t) => t !== undefined).length < smp) {
    if (exitedFlag || Date.now() > deadline) {
      await stop();
      throw new Error(`qemu-system-x86_64 did not start its ${smp} vCPU threads in time; stderr: ${stderr.trim() || '(none)'}`);
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  return { pid: child.pid, qmpPath, name, accel, child, exited, stop };
}

function vcpuTicks(pid: number, tids: number[], procRoot: string): number[] {
  return tids.map((tid) => {
    try {
      const l = fs.readFileSync(path.join(procRoot, String(pid), 'task', String(tid), 'stat'), 'latin1');
      const f = l.slice(l.lastIndexOf(')') + 2).split(' ');
      return Number(f[11]) + Number(f[12]);
    } catch {
      return 0;
    }
  });
}

/**
 * Waits until the guest has booted and its vCPUs load as its mode says (busy ones gain ticks, idle ones
 * do not, over `windowMs`). Booting costs seconds of CPU on the boot vCPU in every mode, so tests
 * that compare loads wait for this first. Resolves false on timeout.
 */
export async function waitSettled(
  g: QemuGuest,
  mode: GuestMode,
  o: { timeoutMs?: number; windowMs?: number; procRoot?: string } = {},
): Promise<boolean> {
  const procRoot = o.procRoot ?? '/proc';
  const windowMs = o.windowMs ?? 1000;
  const deadline = Date.now() + (o.timeoutMs ?? 90_000);
  const tids = vcpuThreads(g.pid, procRoot);
  const busy = tids.map((_, i) => mode === 'a' || (mode === 'b' && i === 0) || (mode === 'p' && i > 0));
  // A busy vCPU gets a third of a CPU on a quiet host, a few hundredths beside two busy loops and other
  // users' work on 2 host CPUs (load 25 or more): 3 ticks of a second's window; an idle one ~0.
  const minBusy = Math.max(2, Math.floor((windowMs / 1000) * 100 * 0.03));
  while (Date.now() < deadline) {
    const a = vcpuTicks(g.pid, tids, procRoot);
    await new Promise((r) => setTimeout(r, windowMs));
    const b = vcpuTicks(g.pid, tids, procRoot);
    if (busy.every((isBusy, i) => (isBusy ? b[i]! - a[i]! >= minBusy : b[i]! - a[i]! <= 1))) return true;
  }
  return false;
}

/** Thread ids of a process and their names (comm), from /proc. */
export function threadNames(pid: number, procRoot = '/proc'): Map<number, string> {
  const out = new Map<number, string>();
  for (const t of fs.readdirSync(path.join(procRoot, String(pid), 'task'))) {
    try {
      out.set(Number(t), fs.readFileSync(path.join(procRoot, String(pid), 'task', t, 'comm'), 'utf8').trim());
    } catch {
      /* thread exited */
    }
  }
  return out;
}

/** vCPU threads by name ("CPU n/KVM" or "CPU n/TCG"), index = vCPU number. */
export function vcpuThreads(pid: number, procRoot = '/proc'): number[] {
  const out: number[] = [];
  for (const [tid, comm] of threadNames(pid, procRoot)) {
    const m = /^CPU (\d+)\/(KVM|TCG)$/.exec(comm);
    if (m) out[Number(m[1])] = tid;
  }
  return out;
}
