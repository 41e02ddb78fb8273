/**
 * What the hostile tests share: a fake host readable by the dropped uid, the attacker (a real
 * process of another uid), and what the kernel says a process listens on.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach } from 'vitest';
import { FakeHost } from '../support/fake-host.js';
import { hostArgs, spawnHelper, startHelper, tempDir, waitFor, type DaemonChild } from '../daemon/support/daemon-process.js';
import { EnergyPump } from '../support/energy-pump.js';
import { raplFakeHost } from '../support/rapl-host.js';
import { markedQemuExe } from '../support/vmsr-fake-qemu.js';

/** The unprivileged attacker: this machine's `nobody`. */
export const NOBODY = 65534;

/** Why the test cannot run here (it needs root to start the daemon with -u and to act as another uid), or null. */
export function notRoot(): string | null {
  return process.getuid?.() === 0 ? null : 'needs root: the daemon drops to -u nobody and the attack runs as uid 65534';
}

const cleanups: (() => void | Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

export function onCleanup(c: () => void | Promise<unknown>): void {
  cleanups.push(c);
}

export function track(child: DaemonChild): DaemonChild {
  onCleanup(() => child.stop('SIGKILL'));
  return child;
}

/** A fake host with RAPL registers, readable by anyone (like /sys), and a socket directory. */
export function fakeHost(): { host: FakeHost; dir: string; sock: string } {
  const host = new FakeHost();
  host.writePackageMsr(0, 0x606, 0xa1003n);
  host.writePackageMsr(0, 0x611, 0x1000n);
  fs.chmodSync(host.dir, 0o755);
  const dir = tempDir('vmsr-hostile-');
  onCleanup(() => {
    host.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return { host, dir, sock: path.join(dir, 'h.sock') };
}

/**
 * The real daemon on a fake host, dropped to `-u nobody`, its socket open to every user (mode 0666,
 * its directory searchable) so the attacker, another uid, connects; `extra` goes after those options.
 */
export async function startDaemonOpenToAll(
  extra: string[] = [],
): Promise<{ daemon: DaemonChild; host: FakeHost; dir: string; sock: string }> {
  const { host, dir, sock } = fakeHost();
  fs.chmodSync(dir, 0o755);
  const daemon = track(await startHelper(['-k', sock, '-u', 'nobody', '--socket-mode', '0666', ...extra, ...hostArgs(host)]));
  return { daemon, host, dir, sock };
}

/** Runs `kill -SIG pid` as `uid` (a real process of another user); resolves with kill's exit code. */
export function killAs(uid: number, signal: string, pid: number): Promise<number> {
  return new Promise((resolve) => {
    execFile('kill', [`-${signal}`, String(pid)], { uid, gid: uid }, (err) => resolve(err ? ((err as { code?: number }).code ?? 1) : 0));
  });
}

/** Inodes of the sockets `pid` holds open (from /proc/PID/fd). */
function socketInodes(pid: number): Set<string> {
  const out = new Set<string>();
  for (const fd of fs.readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(fs.readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m) out.add(m[1]!);
    } catch {
      /* closed meanwhile */
    }
  }
  return out;
}

/** TCP ports `pid` listens on (IPv4 and IPv6), from /proc/PID/net/tcp{,6} matched by socket inode. */
export function tcpListeningPorts(pid: number): number[] {
  const mine = socketInodes(pid);
  const ports: number[] = [];
  for (const table of ['tcp', 'tcp6']) {
    let text: string;
    try {
      text = fs.readFileSync(`/proc/${pid}/net/${table}`, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
      if (f.length < 10 || f[3] !== '0A' || !mine.has(f[9]!)) continue;
      ports.push(parseInt(f[1]!.split(':')[1]!, 16));
    }
  }
  return ports.sort((a, b) => a - b);
}

/** Starts `vmsr-helper exporter` (as `uid` when given) on a free loopback port; resolves with it and its URL. */
export async function startExporterProcess(
  socketPath: string,
  uid?: number,
  env?: NodeJS.ProcessEnv,
): Promise<{ child: DaemonChild; url: string; port: number }> {
  const child = track(
    spawnHelper(['exporter', '-k', socketPath, '--listen', '127.0.0.1:0'], {
      ...(uid !== undefined ? { uid, gid: uid } : {}),
      ...(env ? { env } : {}),
    }),
  );
  let url = '';
  await waitFor(
    () => {
      const m = /Serving metrics on (http:\/\/[^"\s]+)/.exec(child.stderr());
      if (m) url = m[1]!;
      return m !== null;
    },
    'the exporter to serve',
    child,
  );
  return { child, url, port: Number(new URL(url).port) };
}

/** Sleeps `ms`. */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** The daemon's JSON log lines (pino, one object a line); lines that are not JSON are left out. */
export function logLines(stderr: string): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const line of stderr.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      out.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      /* cut mid-line */
    }
  }
  return out;
}

/** Fds `holder` keeps open on files under /proc/<pid>/ (the sampler's kept stat and schedstat files of that process). */
export function fdsOnto(holder: number, pid: number): number {
  let n = 0;
  const prefix = `/proc/${pid}/`;
  for (const fd of fs.readdirSync(`/proc/${holder}/fd`)) {
    try {
      if (fs.readlinkSync(`/proc/${holder}/fd/${fd}`).startsWith(prefix)) n++;
    } catch {
      /* closed meanwhile */
    }
  }
  return n;
}

/** Tasks (threads) on the host now, and the most there may be (pid_max): a test that makes thousands checks the room. */
export function taskRoom(): { tasks: number; pidMax: number } {
  const pidMax = Number(fs.readFileSync('/proc/sys/kernel/pid_max', 'utf8').trim());
  const tasks = Number(fs.readFileSync('/proc/loadavg', 'utf8').split(' ')[3]!.split('/')[1]);
  return { tasks, pidMax };
}

/**
 * The real daemon (root, every capability but CAP_SYS_RAWIO dropped, as the unit starts it) on a
 * fake host whose package counts, publishing into `guestDir` at 0.1 s; `extra` after its options.
 */
export async function startGuestDirDaemon(guestDir: string, extra: string[] = [], env?: NodeJS.ProcessEnv): Promise<DaemonChild> {
  const { host, sock } = fakeHost();
  onCleanup(host.pumpEnergy({ units: 4096, everyMs: 20 }));
  const daemon = track(
    spawnHelper(['-k', sock, ...hostArgs(host), '--interval', '0.1', '--guest-dir', guestDir, ...extra], env ? { env } : {}),
  );
  await waitFor(() => daemon.stderr().includes('"msg":"Listening on'), 'the helper to listen', daemon);
  return daemon;
}

/** The daemon's lines saying it cannot publish into `dir`. */
export function guestDirLines(daemon: DaemonChild, dir: string): string[] {
  return daemon
    .stderr()
    .split('\n')
    .filter((l) => l.includes(`cannot publish into ${dir}`) || l.includes(`cannot write into ${dir}`) || l.includes(`cannot write ${dir}`));
}

/** A new --guest-dir (a directory `guests` in a new temp directory, both 0755), removed after the test. */
export function guestRoot(): string {
  const root = tempDir('vmsr-guests-');
  onCleanup(() => fs.rmSync(root, { recursive: true, force: true }));
  fs.chmodSync(root, 0o755);
  const dir = path.join(root, 'guests');
  fs.mkdirSync(dir, { mode: 0o755 });
  return dir;
}

/**
 * The real daemon in exact mode (`--guest-energy exact -T guest`, dropped to -u nobody, its socket
 * open to all) on a RAPL package whose counter runs (an EnergyPump), and a directory readable by
 * nobody holding QEMU-marked executables (markedQemuExe) and the fakes' logs.
 */
export async function startExactDaemon(extra: string[] = []): Promise<{ daemon: DaemonChild; sock: string; dir: string; exe: string }> {
  const made = raplFakeHost('intel', 0x2a00_0000);
  fs.chmodSync(made.host.dir, 0o755);
  const pump = new EnergyPump(made.host, { msr: made.energyMsr, start: 0x2a00_0000, unitsPerSecond: 120_000 });
  pump.start();
  const dir = tempDir('vmsr-exact-');
  fs.chmodSync(dir, 0o755);
  onCleanup(() => {
    pump.stop();
    made.host.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  const sock = path.join(dir, 'h.sock');
  const args = ['-k', sock, '-u', 'nobody', '--socket-mode', '0666', '--guest-energy', 'exact', '-T', 'guest', ...extra];
  const daemon = track(await startHelper([...args, ...hostArgs(made.host, 'intel')]));
  return { daemon, sock, dir, exe: markedQemuExe(dir) };
}

/** Waits until the daemon said `text` `count` times in all (up to `ms`, far above what it takes). */
export async function said(daemon: DaemonChild, text: string, count = 1, ms = 120_000): Promise<void> {
  await waitFor(() => daemon.stderr().split(text).length - 1 >= count, `the daemon to say "${text}" ${count} time(s)`, daemon, ms);
}
