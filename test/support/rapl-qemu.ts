/**
 * Real QEMU with virtual RAPL for tests: `-accel kvm,rapl=true,rapl-helper-socket=SOCK` running the
 * guest in mode r or s (test/fixtures/guest), which prints the RAPL MSRs it reads on COM1.
 *
 * QEMU (9.1+) refuses RAPL unless (1) the host CPU vendor is Intel and (2)
 * /sys/class/powercap/intel-rapl/enabled reads 1. Test machines are often AMD VMs without RAPL, so
 * QEMU runs in a private mount namespace (unshare -m) where a tmpfs on /sys/class holds that file
 * with 1, and gdb answers the vendor check (rapl/qemu-intel-check.gdb says how). Nothing else is
 * changed: QEMU connects to the helper, reads 0x606/0x610/0x614 once, then 0x611 every second in
 * its vmsr thread, and the guest's RDMSR exits are served by stock QEMU code. The same trick, with
 * /dev/cpu bind-mounted onto the test's MSR files, starts QEMU's own qemu-vmsr-helper for the
 * side-by-side comparison. Needs root (mount namespace), /dev/kvm (RAPL is KVM only), gdb.
 *
 * `user` runs QEMU as another uid/gid from exec on (setpriv before gdb), as libvirt does: QEMU's own
 * -run-with user= switches only after the accelerator is set up, so it would reach the helper
 * socket as root and prove nothing about the socket's permissions.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseStatLine } from '../../src/ratio/stat.js';
import { hasKvm, isRoot, which } from './env.js';
import { canConnect, SPIN_ELF } from './qemu.js';
import { processEnded } from './wait.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const QEMU_GDB = path.join(HERE, 'rapl/qemu-intel-check.gdb');
const HELPER_GDB = path.join(HERE, 'rapl/qemu-vmsr-helper-intel-check.gdb');

/** QEMU gained -accel kvm,rapl=true in 9.1. */
export const MIN_RAPL_QEMU: readonly [number, number] = [9, 1];
/** The qemu-vmsr-helper build whose CPUID check offset rapl/qemu-vmsr-helper-intel-check.gdb knows. */
export const KNOWN_VMSR_HELPER_BUILD = '1:10.0.2+ds-2+deb13u1~bpo12+1';
const VMSR_HELPER = '/usr/bin/qemu-vmsr-helper';
const VMSR_HELPER_CPUID_AFTER = 0x3a5ee;

/** [major, minor] of qemu-system-x86_64, or null when it is missing or says something else. */
export function qemuVersion(): [number, number] | null {
  try {
    const out = execFileSync('qemu-system-x86_64', ['--version'], { encoding: 'utf8' });
    const m = /version (\d+)\.(\d+)/.exec(out);
    return m ? [Number(m[1]), Number(m[2])] : null;
  } catch {
    return null;
  }
}

/** Why a RAPL-enabled QEMU cannot run here, or null. */
export function raplQemuMissing(): string | null {
  if (!isRoot()) return 'needs root (a private mount namespace for QEMU; CI runs as root)';
  if (!hasKvm()) return '/dev/kvm missing or not usable: QEMU does RAPL under KVM only (TCG cannot)';
  const v = qemuVersion();
  if (!v) return 'qemu-system-x86_64 not installed (.ci/run installs QEMU 10 from bookworm-backports)';
  if (v[0] < MIN_RAPL_QEMU[0] || (v[0] === MIN_RAPL_QEMU[0] && v[1] < MIN_RAPL_QEMU[1])) {
    return `qemu-system-x86_64 ${v.join('.')} has no rapl=true (needs ${MIN_RAPL_QEMU.join('.')}+; .ci/run installs it from bookworm-backports)`;
  }
  for (const cmd of ['gdb', 'unshare', 'setpriv'])
    if (!which(cmd)) return `${cmd} not installed (apt-get install ${cmd === 'gdb' ? 'gdb' : 'util-linux'})`;
  if (!fs.existsSync(SPIN_ELF)) return `guest kernel ${SPIN_ELF} missing (make -C test/fixtures/guest)`;
  return null;
}

/** Why QEMU's own qemu-vmsr-helper cannot be started here for a comparison, or null. */
export function qemuVmsrHelperMissing(): string | null {
  const why = raplQemuMissing();
  if (why) return why;
  if (!fs.existsSync(VMSR_HELPER)) return `${VMSR_HELPER} missing (apt-get install -t bookworm-backports qemu-system-common)`;
  let build = '';
  try {
    build = execFileSync('dpkg-query', ['-W', '-f', '${Version}', 'qemu-system-common'], { encoding: 'utf8' }).trim();
  } catch {
    return 'dpkg-query cannot tell the qemu-system-common version';
  }
  if (build !== KNOWN_VMSR_HELPER_BUILD)
    return `qemu-system-common ${build} installed; the gdb vendor answer knows only ${KNOWN_VMSR_HELPER_BUILD}`;
  const fd = fs.openSync(VMSR_HELPER, 'r');
  const b = Buffer.alloc(2);
  try {
    fs.readSync(fd, b, 0, 2, VMSR_HELPER_CPUID_AFTER - 2);
  } finally {
    fs.closeSync(fd);
  }
  if (b.toString('hex') !== '0fa2')
    return `${VMSR_HELPER}: no CPUID instruction before offset 0x${VMSR_HELPER_CPUID_AFTER.toString(16)}; not the expected build`;
  if (!fs.existsSync('/dev/cpu')) return '/dev/cpu missing (modprobe msr or cpuid creates it; the MSR files are bind-mounted there)';
  return null;
}

/**
 * The host pid of the process whose pid in its own namespace is `nsPid` (the last NSpid of its
 * status) and whose command line holds `arg`; NaN when there is none.
 */
function hostPidOf(nsPid: number, arg: string): number {
  if (!Number.isSafeInteger(nsPid) || nsPid < 1) return NaN;
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d) || !cmdline(Number(d)).includes(arg)) continue;
    let status: string;
    try {
      status = fs.readFileSync(`/proc/${d}/status`, 'utf8');
    } catch {
      continue;
    }
    const ns = /^NSpid:\s+(.*)$/m.exec(status)?.[1]?.trim().split(/\s+/);
    if (ns && Number(ns.at(-1)) === nsPid) return Number(d);
  }
  return NaN;
}

/** Kills what tests started if a test forgets (or the worker dies). */
const live = new Set<number>();
let hooked = false;
function track(pid: number): void {
  live.add(pid);
  if (hooked) return;
  hooked = true;
  process.on('exit', () => {
    for (const p of live) {
      try {
        process.kill(p, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
  });
}

/** Whether `pid` still runs (not gone, not a zombie). */
const alive = (pid: number): boolean => !processEnded(pid);

function cmdline(pid: number): string[] {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'latin1').split('\0').slice(0, -1);
  } catch {
    return [];
  }
}

async function killAndWait(pid: number, signal: NodeJS.Signals, ms = 10_000): Promise<void> {
  try {
    process.kill(pid, signal);
  } catch {
    /* gone */
  }
  const end = Date.now() + ms;
  while (alive(pid)) {
    if (Date.now() > end) {
      process.kill(pid, 'SIGKILL');
      await new Promise((r) => setTimeout(r, 200));
      break;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  live.delete(pid);
}

/** Script run by `unshare -m` as root: the fake RAPL sysfs flag, optional /dev/cpu bind, then exec. */
const NAMESPACE_SETUP = `set -e
if [ -n "$1" ]; then mount --bind "$1" /dev/cpu; fi
shift
mount -t tmpfs -o mode=0755 tmpfs /sys/class
mkdir -p /sys/class/powercap/intel-rapl
echo 1 > /sys/class/powercap/intel-rapl/enabled
exec "$@"`;

/**
 * Runs `argv` under gdb in the namespace, itself run through `inside` when given; resolves when gdb
 * has let go (exit 0), with the collected stderr.
 */
function runInNamespace(
  argv: string[],
  msrDir: string | null,
  inside: (argv: readonly string[]) => string[] = (a) => [...a],
): { child: ChildProcess; done: Promise<number>; stderr: () => string } {
  const [cmd, ...args] = inside(['unshare', '-m', '--propagation', 'private', 'sh', '-c', NAMESPACE_SETUP, 'sh', msrDir ?? '', ...argv]);
  const child = spawn(cmd!, args, {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let err = '';
  child.stderr!.setEncoding('utf8');
  child.stderr!.on('data', (d: string) => {
    if (err.length < 16_384) err += d;
  });
  const done = new Promise<number>((resolve) => {
    child.once('exit', (code) => resolve(code ?? -1));
    child.once('error', () => resolve(-1));
  });
  return { child, done, stderr: () => err };
}

export interface RaplQemuOptions {
  /** Helper socket for rapl-helper-socket=. */
  socket: string;
  /** Directory for the serial log and pidfile; must be writable by `user` when given. */
  dir: string;
  name: string;
  /**
   * The guest's mode (test/fixtures/guest): 'r' (default) prints 0x611 again and again, 's' each time
   * it changed (a line per step of QEMU's counter, seen within milliseconds), 't' as s on the boot
   * vCPU and on the second vCPU, whose lines go to COM2 (`serial2Path`; give -smp 2,sockets=2).
   */
  mode?: 'r' | 's' | 't';
  /** Run QEMU as this uid/gid (no supplementary groups), from exec on. */
  user?: { uid: number; gid: number };
  /** More QEMU arguments (e.g. -run-with). */
  extraArgs?: string[];
  /** How long QEMU may take to get past its start-up (connect + 3 reads); default 60 s. */
  timeoutMs?: number;
  /**
   * Runs QEMU in another PID and mount namespace: the command wrapped (e.g. RealSystemd.inside, so
   * that a helper in that namespace sees QEMU's pid). QEMU's pidfile then holds its pid in that
   * namespace; `pid` is still the host's, and `nsPid` the namespace's.
   */
  inside?: (argv: readonly string[]) => string[];
}

export interface RaplQemu {
  /** QEMU's pid in the test's PID namespace. */
  pid: number;
  /** QEMU's pid in its own PID namespace (what a helper there sees); `pid` without `inside`. */
  nsPid: number;
  serialPath: string;
  /** COM2's file: the second vCPU's lines in mode t. */
  serial2Path: string;
  /** QEMU's stderr (it inherits gdb's). */
  stderr(): string;
  alive(): boolean;
  /** SIGTERM, then SIGKILL after 10 s; safe to call twice. */
  stop(): Promise<void>;
}

/** Starts QEMU with the guest in mode r (or `mode`), 1 vCPU; resolves once QEMU is past its RAPL start-up. */
export async function startRaplQemu(o: RaplQemuOptions): Promise<RaplQemu> {
  const why = raplQemuMissing();
  if (why) throw new Error(why);
  const serialPath = path.join(o.dir, `${o.name}.com1`);
  const serial2Path = path.join(o.dir, `${o.name}.com2`);
  const pidPath = path.join(o.dir, `${o.name}.pid`);
  const qemu = [
    'qemu-system-x86_64',
    '-accel',
    `kvm,rapl=true,rapl-helper-socket=${o.socket}`,
    '-smp',
    '1',
    '-m',
    '64',
    '-nodefaults',
    '-display',
    'none',
    '-kernel',
    SPIN_ELF,
    '-append',
    `mode=${o.mode ?? 'r'}`,
    '-serial',
    `file:${serialPath}`,
    ...(o.mode === 't' ? ['-serial', `file:${serial2Path}`] : []),
    '-pidfile',
    pidPath,
    '-name',
    `${o.name},debug-threads=on`,
    ...(o.extraArgs ?? []),
  ];
  const asUser = o.user ? ['setpriv', `--reuid=${o.user.uid}`, `--regid=${o.user.gid}`, '--clear-groups', '--'] : [];
  const run = runInNamespace([...asUser, 'gdb', '-batch', '-nx', '-x', QEMU_GDB, '--args', ...qemu], null, o.inside);
  const timeout = new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), o.timeoutMs ?? 60_000).unref());
  const code = await Promise.race([run.done, timeout]);
  const nsPid = fs.existsSync(pidPath) ? Number(fs.readFileSync(pidPath, 'utf8').trim()) : NaN;
  const pid = o.inside ? hostPidOf(nsPid, `file:${serialPath}`) : nsPid;
  // The pidfile is ours (a fresh dir), but check the process really is this QEMU before trusting it.
  const ours = Number.isSafeInteger(pid) && pid > 1 && cmdline(pid).includes(`file:${serialPath}`);
  if (ours) track(pid);
  if (code !== 0 || !ours || !alive(pid)) {
    run.child.kill('SIGKILL');
    if (ours) await killAndWait(pid, 'SIGKILL');
    throw new Error(
      `QEMU with rapl=true did not start (${code === 'timeout' ? 'timed out' : `gdb exit ${code}`}): ${run.stderr().trim() || '(no stderr)'}`,
    );
  }
  let stopped = false;
  return {
    pid,
    nsPid,
    serialPath,
    serial2Path,
    stderr: run.stderr,
    alive: () => alive(pid),
    async stop() {
      if (stopped) return;
      stopped = true;
      await killAndWait(pid, 'SIGTERM');
    },
  };
}

/**
 * Starts QEMU's own /usr/bin/qemu-vmsr-helper on `socket`, as root, in a namespace where
 * /dev/cpu is `msrDir` (the test's MSR files, cpu N at msrDir/N/msr).
 */
export async function startQemuVmsrHelper(
  socket: string,
  msrDir: string,
  timeoutMs = 30_000,
): Promise<{ pid: number; stderr(): string; stop(): Promise<void> }> {
  const why = qemuVmsrHelperMissing();
  if (why) throw new Error(why);
  const argv = [VMSR_HELPER, '-k', socket];
  const run = runInNamespace(['gdb', '-batch', '-nx', '-x', HELPER_GDB, '--args', ...argv], msrDir);
  const code = await run.done;
  // gdb has let go: find the helper by its exact command line (the socket path is unique to the test).
  const pid = fs
    .readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .map(Number)
    .find((p) => {
      const c = cmdline(p);
      return c.length === argv.length && c.every((a, i) => a === argv[i]);
    });
  if (pid === undefined || code !== 0) throw new Error(`qemu-vmsr-helper did not start (gdb exit ${code}): ${run.stderr().trim()}`);
  track(pid);
  const end = Date.now() + timeoutMs;
  while (!(await canConnect(socket))) {
    if (!alive(pid) || Date.now() > end) {
      await killAndWait(pid, 'SIGKILL');
      throw new Error(`qemu-vmsr-helper never listened on ${socket}: ${run.stderr().trim()}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return { pid, stderr: run.stderr, stop: () => killAndWait(pid, 'SIGTERM') };
}

/** One line the guest printed: `MSR VALUE` in hex, with the time (ms, Date.now()) the test saw it. */
export interface GuestMsrLine {
  msr: number;
  value: bigint;
  seenAt: number;
}

const LINE = /^([0-9a-f]{8}) ([0-9a-f]{16})$/;

/**
 * Follows the guest's COM1 log. Only complete lines count; a line that is not `MSR VALUE` (e.g.
 * firmware noise) is kept in `other` and otherwise ignored.
 */
export class GuestSerial {
  readonly lines: GuestMsrLine[] = [];
  readonly other: string[] = [];
  private offset = 0;
  private partial = '';

  constructor(readonly file: string) {}

  /** Reads what the guest wrote since the last call. */
  poll(): void {
    let fd: number;
    try {
      fd = fs.openSync(this.file, 'r');
    } catch {
      return;
    }
    try {
      const buf = Buffer.alloc(65_536);
      for (;;) {
        const n = fs.readSync(fd, buf, 0, buf.length, this.offset);
        if (n <= 0) break;
        this.offset += n;
        this.partial += buf.subarray(0, n).toString('latin1');
      }
    } finally {
      fs.closeSync(fd);
    }
    const now = Date.now();
    const parts = this.partial.split('\n');
    this.partial = parts.pop()!;
    for (const raw of parts) {
      const l = raw.replace(/\r$/, '');
      const m = LINE.exec(l);
      if (m) this.lines.push({ msr: parseInt(m[1]!, 16), value: BigInt(`0x${m[2]}`), seenAt: now });
      else if (l.length && this.other.length < 100) this.other.push(l.slice(0, 200));
    }
  }

  /** The first value printed for `msr`, or undefined. */
  first(msr: number): bigint | undefined {
    return this.lines.find((l) => l.msr === msr)?.value;
  }

  energy(): GuestMsrLine[] {
    return this.lines.filter((l) => l.msr === 0x611);
  }

  /** Polls every 50 ms until `cond` holds; throws naming `what` (with the log tail) after `ms`. */
  async waitFor(cond: () => boolean, what: string, ms = 60_000, qemu?: RaplQemu): Promise<void> {
    const end = Date.now() + ms;
    for (;;) {
      this.poll();
      if (cond()) return;
      if (qemu && !qemu.alive()) throw new Error(`${what}: QEMU exited\n${qemu.stderr()}`);
      if (Date.now() > end) {
        const tail = this.lines.slice(-5).map((l) => `${l.msr.toString(16)} ${l.value.toString(16)}`);
        throw new Error(
          `timed out waiting for ${what}; last guest lines: ${tail.join(' | ') || '(none)'}; other: ${this.other.slice(-3).join(' | ')}`,
        );
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

/** CPU ticks (utime + stime) of a QEMU's vCPU threads ("CPU n/KVM") and of its other threads. */
export function qemuThreadTicks(pid: number): { vcpu: number; other: number } {
  let vcpu = 0;
  let other = 0;
  for (const t of fs.readdirSync(`/proc/${pid}/task`)) {
    let line: string;
    try {
      line = fs.readFileSync(`/proc/${pid}/task/${t}/stat`, 'latin1');
    } catch {
      continue; // thread exited
    }
    const parsed = parseStatLine(line);
    if (!parsed.ok) throw new Error(`cannot parse /proc/${pid}/task/${t}/stat: ${parsed.error}`);
    const s = parsed.value;
    if (/^CPU \d+\/KVM$/.test(s.comm)) vcpu += s.utime + s.stime;
    else other += s.utime + s.stime;
  }
  return { vcpu, other };
}
