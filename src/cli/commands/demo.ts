/** `vmsr-helper demo` (docs/try-it.md): daemon (synthetic energy: every output says so), exporter and VM, in a temporary directory. */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Command } from 'commander';
import { DEFAULT_LISTEN, formatListenAddress, parseListenAddress, type ListenAddress } from '../../exporter/listen-address.js';
import { formatPrettyLine } from '../../logging/logger.js';
import { cannotError } from '../../common/errors.js';
import { listenAddressArg, secondsArg } from '../options.js';
import { onStopSignals } from '../stop-signals.js';

/** The demo VM's identity, as its QEMU-like command line gives it to discovery. */
export const DEMO_VM = { name: 'demo-vm', uuid: '00000000-0000-4000-8000-00000000de70', vcpus: 2 } as const;
/** How long each child may take to come up, and to stop after SIGTERM before SIGKILL. */
const START_TIMEOUT_MS = 30_000;
const STOP_TIMEOUT_MS = 10_000;
const MAX_DURATION_S = 7 * 24 * 3600;

interface DemoOptions {
  listen?: ListenAddress;
  vm: boolean;
  duration?: number;
}

export function addDemoCommand(program: Command): void {
  program
    .command('demo')
    .description(
      'try the whole chain without RAPL: the daemon on SYNTHETIC energy, the exporter and a demo VM, in a temporary directory, until Ctrl-C',
    )
    .option(
      '--listen <host:port>',
      `where the exporter serves /metrics (default ${DEFAULT_LISTEN}; port 0: any free port)`,
      listenAddressArg,
    )
    .option('--no-vm', 'start no demo VM (the daemon still discovers the QEMU processes of this host)')
    .option(
      '--duration <s>',
      'stop by itself after S seconds (default: until Ctrl-C or SIGTERM)',
      secondsArg('--duration', { max: MAX_DURATION_S }),
    )
    .action(async (_o: unknown, cmd: Command) => {
      process.exitCode = await runDemo(cmd.opts<DemoOptions>());
    });
}

/** A child whose stderr (and stdout) lines go to ours, prefixed, pino records made readable. */
class Child {
  readonly proc: ChildProcess;
  readonly exited: Promise<string>;
  private readonly waiters: { match: RegExp; resolve: (m: RegExpMatchArray) => void }[] = [];

  constructor(
    readonly label: string,
    command: string[],
    env: NodeJS.ProcessEnv = process.env,
  ) {
    this.proc = spawn(command[0]!, command.slice(1), { stdio: ['ignore', 'pipe', 'pipe'], env });
    for (const stream of [this.proc.stdout!, this.proc.stderr!]) {
      let rest = '';
      stream.setEncoding('utf8');
      stream.on('data', (d: string) => {
        const lines = (rest + d).split('\n');
        rest = lines.pop()!;
        for (const l of lines) this.line(l);
      });
    }
    this.exited = new Promise((resolve) => this.proc.once('exit', (code, sig) => resolve(sig ?? `exit code ${code}`)));
  }

  /** The first line of its output matching `match`, or a failure when it exits first or after `ms`. */
  waitFor(match: RegExp, what: string, ms = START_TIMEOUT_MS): Promise<RegExpMatchArray> {
    return new Promise((resolve, reject) => {
      const t = setTimeout(
        () => reject(cannotError(`start the demo's ${this.label}`, `no ${what} within ${ms / 1000} s`, 'see its lines above')),
        ms,
      );
      this.waiters.push({
        match,
        resolve: (m) => {
          clearTimeout(t);
          resolve(m);
        },
      });
      void this.exited.then((how) => {
        clearTimeout(t);
        reject(cannotError(`start the demo's ${this.label}`, `it ended (${how}) before ${what}`, 'see its lines above'));
      });
    });
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    this.proc.kill('SIGTERM');
    const t = setTimeout(() => this.proc.kill('SIGKILL'), STOP_TIMEOUT_MS);
    await this.exited;
    clearTimeout(t);
  }

  private line(l: string): void {
    let text = l;
    if (l.startsWith('{')) {
      try {
        text = formatPrettyLine(l).trimEnd();
      } catch {
        /* not a log record: as it is */
      }
    }
    if (this.label !== 'demo VM') process.stderr.write(`[${this.label}] ${text}\n`);
    for (const [i, w] of this.waiters.entries()) {
      const m = w.match.exec(l);
      if (m) {
        this.waiters.splice(i, 1);
        w.resolve(m);
        break;
      }
    }
  }
}

/** Where the demo's children and files are. */
interface DemoPlace {
  /** node and this script, to start the daemon and the exporter. */
  node: string[];
  dir: string;
  socket: string;
}

/** How the printed commands start: `vmsr-helper` where that name runs this script, else node and its path. */
export function selfCommand(script: string, cwd = process.cwd(), searchPath = process.env.PATH ?? ''): string {
  const real = realpathOr(script) ?? path.resolve(script);
  // npm run and npx put their own .bin folders first on PATH: another terminal has none of them.
  const dirs = searchPath.split(':').filter((d) => d !== '' && !d.includes('/_npx/') && !d.includes('node_modules/.bin'));
  if (dirs.some((d) => realpathOr(path.join(d, 'vmsr-helper')) === real)) return 'vmsr-helper';
  const rel = path.relative(cwd, real);
  // Relative only in a clone (the script under this directory): an install (node_modules) gets its absolute path.
  const shown = rel.startsWith('..') || path.isAbsolute(rel) || rel.split(path.sep).includes('node_modules') ? real : rel;
  const nodeOnPath = dirs.some((d) => realpathOr(path.join(d, 'node')) === realpathOr(process.execPath));
  return `${nodeOnPath ? 'node' : process.execPath} ${shown}`;
}

function realpathOr(file: string): string | null {
  try {
    return fs.realpathSync(file);
  } catch {
    return null;
  }
}

/** The daemon on synthetic energy; this user's group may observe every VM, so the exporter (same user) sees the host too. */
async function startDaemon(at: DemoPlace, children: Child[], stopped: Promise<string>): Promise<Child> {
  const daemon = new Child('daemon', [
    ...at.node,
    '--energy-source',
    'synthetic',
    '-k',
    at.socket,
    '-f',
    path.join(at.dir, 'vmsr.pid'),
    '--observer-group',
    String(process.getgid!()),
  ]);
  children.push(daemon);
  await Promise.race([daemon.waitFor(/Listening on /, 'its socket'), stopped.then((why) => Promise.reject(new Error(why)))]);
  return daemon;
}

/** The demo VM: its pid and vCPU thread ids once its threads run. */
async function startDemoVm(children: Child[]): Promise<{ pid: number; tids: number[] }> {
  const vmScript = fileURLToPath(new URL('../demo/demo-vm.js', import.meta.url));
  const child = new Child('demo VM', [
    process.execPath,
    vmScript,
    '-name',
    `${DEMO_VM.name},debug-threads=on`,
    '-uuid',
    DEMO_VM.uuid,
    '-smp',
    `${DEMO_VM.vcpus},sockets=${DEMO_VM.vcpus}`,
  ]);
  children.push(child);
  const ready = await child.waitFor(/^ready ((?:\d+ ?)+)$/, 'its vCPU threads');
  return { pid: child.proc.pid!, tids: ready[1]!.trim().split(' ').map(Number) };
}

/** The exporter on `listen`; the URL it serves. */
async function startDemoExporter(at: DemoPlace, listen: ListenAddress, children: Child[]): Promise<string> {
  const exporter = new Child('exporter', [...at.node, 'exporter', '--socket', at.socket, '--listen', formatListenAddress(listen)]);
  children.push(exporter);
  return (await exporter.waitFor(/Serving metrics on (http:\/\/\S+?\/metrics)/, 'its HTTP port'))[1]!;
}

/** What the demo prints once everything runs: what is where, and commands that run as printed. */
function banner(at: DemoPlace, daemonPid: number, url: string, vm: { pid: number } | null, me: string): string[] {
  return [
    '',
    'vmsr-helper demo is running, on SYNTHETIC energy (not a measurement):',
    `  daemon    pid ${daemonPid}, socket ${at.socket}`,
    `  exporter  ${url}   (vmsr_energy_source_info{source="synthetic"} 1)`,
    vm
      ? `  demo VM   pid ${vm.pid}, "${DEMO_VM.name}", ${DEMO_VM.vcpus} vCPUs in ${DEMO_VM.vcpus} virtual packages: vCPU 0 busy half the time, vCPU 1 idle`
      : '  no demo VM (--no-vm)',
    'Look at it from another terminal (in this directory):',
    `  ${me} stats -k ${at.socket}`,
    ...(vm ? [`  ${me} watch -k ${at.socket} ${vm.pid}`] : []),
    ...(vm ? [`  ${me} record --vm "$(cat ${at.dir}/vm.pid)" -k ${at.socket} -o demo.jsonl.gz --duration 3`] : []),
    `  curl -s ${url} | grep -E '^vmsr_(energy_source_info|vm_power_watts|host_package_energy)'`,
    `Ctrl-C (or SIGTERM to pid ${process.pid}) stops all three and removes ${at.dir}.`,
    '',
  ];
}

/** Runs the demo until a signal or --duration; the exit code. */
async function runDemo(o: DemoOptions): Promise<number> {
  const script = process.argv[1]!;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-demo-'));
  const at: DemoPlace = { node: [process.execPath, script], dir, socket: path.join(dir, 'vmsr.sock') };
  const children: Child[] = [];
  let stopping: ((why: string) => void) | null = null;
  const stopped = new Promise<string>((resolve) => (stopping = resolve));
  const signals = onStopSignals((sig) => stopping!(`${sig} received`));
  let code = 0;
  try {
    process.stderr.write(
      'vmsr-helper demo: the energy is SYNTHETIC (no RAPL register is read): per package 20 W idle + 40 W x the busy share of its CPUs, from /proc/stat\n',
    );
    const daemon = await startDaemon(at, children, stopped);
    const vm = o.vm ? await startDemoVm(children) : null;
    // Its pid names it for --vm even when another demo's VM (same name, same UUID) runs on this host.
    if (vm) fs.writeFileSync(path.join(dir, 'vm.pid'), `${vm.pid}\n`);
    const url = await startDemoExporter(at, o.listen ?? parseListenAddress(DEFAULT_LISTEN), children);
    process.stdout.write(banner(at, daemon.proc.pid!, url, vm, selfCommand(script)).join('\n') + '\n');

    const timer = o.duration !== undefined ? setTimeout(() => stopping!(`--duration ${o.duration} s elapsed`), o.duration * 1000) : null;
    const ended = children.map((c) => c.exited.then((how) => `the demo's ${c.label} ended (${how})`));
    const why = await Promise.race([stopped, ...ended.map((p) => p.then((w) => Promise.reject(new Error(w))))]);
    if (timer) clearTimeout(timer);
    process.stderr.write(`vmsr-helper demo: stopping (${why})\n`);
  } catch (e) {
    const message = (e as Error).message;
    if (!/ received$/.test(message)) {
      process.stderr.write(`vmsr-helper demo: ${message}\n`);
      code = 1;
    }
  } finally {
    // The exporter first (it would log the daemon's going), then the VM, then the daemon. The signal
    // handlers stay until the directory is gone: a second Ctrl-C (or a SIGTERM sent to the process and
    // its group, as timeout(1) does) would otherwise end the demo mid-way and leave it behind.
    for (const c of [...children].reverse()) await c.stop();
    fs.rmSync(dir, { recursive: true, force: true });
    signals.dispose();
  }
  return code;
}
