/**
 * A service manager for the fd-store restart tests (docs/daemon.md "Restarts", through systemd's fd
 * store): the real systemd when it can run here as PID 1 of a new PID and mount namespace (booted to
 * an empty target, so nothing but our two units starts), else nothing, with the reason. Units are
 * written to a tmpfs on /run inside that namespace; the daemon's log goes to a file outside it.
 *
 * The real systemd is what `systemctl restart` is tested against, with its own fd store: FDSTORE=1
 * datagrams, FileDescriptorStoreMax=, FDPOLL=, FDSTOREREMOVE=1, LISTEN_FDS/LISTEN_FDNAMES and FDSTORE=.
 */
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll } from 'vitest';
import { BIN, ensureBuilt, hostArgs, tempDir } from '../../daemon/support/daemon-process.js';
import { EnergyPump } from '../../support/energy-pump.js';
import { FakeHost } from '../../support/fake-host.js';

export const SYSTEMD = '/lib/systemd/systemd';
/** Longest wait for the booted systemd to answer systemctl. */
const BOOT_MS = 15_000;

export interface Units {
  /** The .socket unit's ListenStream= path. */
  socket: string;
  /** ExecStart= of the service, as argv. */
  execStart: string[];
  /** Where the service's stdout and stderr are appended. */
  log: string;
  /** More lines for the service's [Service] section (e.g. Restart=on-failure). */
  service?: string[];
}

/** Not starting with STORED_FD_PREFIX ('vmsr-'): the socket's fd is named after its unit. */
export const UNIT = 'qemu-vmsr-test';

function unitFiles(u: Units): Record<string, string> {
  return {
    'vmsr-idle.target': '[Unit]\nDescription=nothing to start\nDefaultDependencies=no\n',
    [`${UNIT}.socket`]: `[Unit]\nDefaultDependencies=no\n[Socket]\nListenStream=${u.socket}\nSocketMode=0600\n`,
    [`${UNIT}.service`]: [
      '[Unit]',
      'DefaultDependencies=no',
      // Restarted more often than systemd's default start limit (5 in 10 s) allows.
      'StartLimitIntervalSec=0',
      `Requires=${UNIT}.socket`,
      `After=${UNIT}.socket`,
      '[Service]',
      'Type=notify',
      'NotifyAccess=main',
      `ExecStart=${u.execStart.map((a) => a.replace(/%/g, '%%')).join(' ')}`,
      'FileDescriptorStoreMax=4200',
      'TimeoutStopSec=10s',
      `StandardOutput=append:${u.log}`,
      `StandardError=append:${u.log}`,
      ...(u.service ?? []),
      '',
    ].join('\n'),
  };
}

const BOOT = `set -e
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/systemd/system
cp "$1"/* /run/systemd/system/
exec ${SYSTEMD} --system --unit=vmsr-idle.target --log-target=console --log-level=notice
`;

export class RealSystemd {
  private constructor(
    private readonly unshare: ChildProcess,
    /** The host pid of the namespace's PID 1. */
    readonly pid: number,
    readonly version: string,
  ) {}

  /** Boots systemd in a new PID and mount namespace with `units`; throws with why it cannot. */
  static async boot(units: Units, dir: string): Promise<RealSystemd> {
    if (process.getuid?.() !== 0) throw new Error('not root');
    if (!fs.existsSync(SYSTEMD)) throw new Error(`${SYSTEMD} is not installed`);
    const version = execFileSync(SYSTEMD, ['--version'], { encoding: 'utf8' }).split('\n')[0]!;
    const unitDir = path.join(dir, 'units');
    fs.mkdirSync(unitDir);
    for (const [name, text] of Object.entries(unitFiles(units))) fs.writeFileSync(path.join(unitDir, name), text);
    const log = fs.openSync(path.join(dir, 'systemd.log'), 'a');
    const unshare = spawn('unshare', ['--pid', '--fork', '--mount-proc', 'sh', '-c', BOOT, 'boot', unitDir], {
      stdio: ['ignore', log, log],
      detached: true,
    });
    fs.closeSync(log);
    const end = Date.now() + BOOT_MS;
    let pid = 0;
    for (;;) {
      if (unshare.exitCode !== null)
        throw new Error(`unshare exited ${unshare.exitCode}: ${fs.readFileSync(path.join(dir, 'systemd.log'), 'utf8')}`);
      if (pid === 0) {
        const children = fs.readFileSync(`/proc/${unshare.pid}/task/${unshare.pid}/children`, 'utf8').trim();
        pid = Number(children.split(' ')[0] ?? 0);
      }
      if (pid > 0) {
        const m = new RealSystemd(unshare, pid, version);
        try {
          const state = m.systemctl('is-system-running').trim();
          if (state === 'running' || state === 'degraded') return m;
        } catch {
          /* not up yet */
        }
      }
      if (Date.now() > end) {
        try {
          process.kill(-unshare.pid!, 'SIGKILL');
        } catch {
          /* gone */
        }
        throw new Error(
          `systemd did not come up within ${BOOT_MS} ms: ${fs.readFileSync(path.join(dir, 'systemd.log'), 'utf8').slice(-2000)}`,
        );
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** systemctl inside the namespace; its stdout (throws on a non-zero exit, as execFileSync does). */
  systemctl(...args: string[]): string {
    const [cmd, ...rest] = this.inside(['systemctl', '--no-pager', ...args]);
    return execFileSync(cmd!, rest, {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: 30_000,
    });
  }

  /** systemctl as above, without blocking the test's event loop meanwhile (a test timing other processes). */
  async systemctlAsync(...args: string[]): Promise<string> {
    const [cmd, ...rest] = this.inside(['systemctl', '--no-pager', ...args]);
    const { stdout } = await promisify(execFile)(cmd!, rest, { encoding: 'utf8', timeout: 30_000 });
    return stdout;
  }

  /**
   * `argv` run inside the namespace (its PID namespace too): a client the daemon must see as a
   * process (peer credentials give pid 0 for a peer outside the daemon's PID namespace).
   */
  inside(argv: readonly string[]): string[] {
    return ['nsenter', '-t', String(this.pid), '-m', '-p', ...argv];
  }

  /** A property of the service (systemctl show -p NAME --value). */
  show(prop: string): string {
    return this.systemctl('show', '-p', prop, '--value', `${UNIT}.service`).trim();
  }

  /** Ends the namespace: its PID 1 killed, every process in it goes. */
  async close(): Promise<void> {
    const gone = new Promise<void>((resolve) => (this.unshare.exitCode !== null ? resolve() : this.unshare.once('exit', () => resolve())));
    try {
      process.kill(this.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
    await gone;
  }
}

/** A booted systemd (or why not) serving the daemon on a fake host with its package counter pumped; close() ends it all. */
export interface FdStoreBed {
  manager: RealSystemd | null;
  why: string;
  sock: string;
  logFile: string;
  close(): Promise<void>;
}

/**
 * The bed of the fd-store tests: a FakeHost (one package, two cpus, its counter pumped), the daemon as
 * the service (`--interval 0.1`, `service` lines added to its unit), systemd booted on it.
 */
export async function fdStoreBed(prefix: string, service: string[] = []): Promise<FdStoreBed> {
  ensureBuilt();
  const host = new FakeHost({ packages: [0, 0], online: [0, 1] });
  host.writePackageMsr(0, 0x606, 0xa1003n);
  const pump = new EnergyPump(host, { msr: 0x611, start: 0x1000, unitsPerSecond: 50_000 });
  pump.start();
  const dir = tempDir(prefix);
  const sock = path.join(dir, 'helper.sock');
  const logFile = path.join(dir, 'helper.log');
  let manager: RealSystemd | null = null;
  let why: string;
  try {
    manager = await RealSystemd.boot(
      { socket: sock, execStart: [process.execPath, BIN, ...hostArgs(host), '--interval', '0.1'], log: logFile, service },
      dir,
    );
    why = `real systemd (${manager.version}) as PID 1 of a new PID namespace`;
  } catch (e) {
    why = `systemd cannot run here: ${(e as Error).message.split('\n')[0]}`;
  }
  return {
    manager,
    why,
    sock,
    logFile,
    async close() {
      pump.stop();
      await manager?.close();
      host.cleanup();
    },
  };
}

/** How many log lines so far have the message starting with `msg` (the daemon logs JSON lines). */
export const countMsg = (text: string, msg: string): number => text.split(`"msg":"${msg}`).length - 1;

/** A file's fd-store bed, filled in before its tests run: `manager` is null (with `why`) where systemd cannot run. */
export interface FileFdStoreBed {
  manager: RealSystemd | null;
  why: string;
  sock: string;
  /** The service's log so far. */
  log(): string;
}

/**
 * The fd-store bed (fdStoreBed) booted before the tests of this file and closed after them, printing
 * which manager `what` runs under.
 */
export function fdStoreBedForFile(prefix: string, what: string, service: string[] = []): FileFdStoreBed {
  const f: FileFdStoreBed = { manager: null, why: '', sock: '', log: () => '' };
  let booting: Promise<FdStoreBed> | undefined;
  beforeAll(async () => {
    booting = fdStoreBed(prefix, service);
    const bed = await booting;
    const { logFile } = bed;
    Object.assign(f, {
      manager: bed.manager,
      why: bed.why,
      sock: bed.sock,
      log: () => (fs.existsSync(logFile) ? fs.readFileSync(logFile, 'utf8') : ''),
    });
    console.log(`${what} run under: ${f.why}`);
  }, 60_000);
  // A boot still running when the hook above timed out is waited for and ended too: no systemd outlives the file.
  afterAll(async () => {
    const bed = await booting?.catch(() => undefined);
    await bed?.close();
  }, 120_000);
  return f;
}
