/**
 * The performance table: ours ÷ QEMU 10.0.2's C qemu-vmsr-helper (the anchor), side by side on the
 * same fake MSR files, 5 repeats alternating which helper goes first. Each figure is printed with
 * the median of the per-repeat values and their spread (min–max); a ratio is the median of the
 * per-repeat ratios. Never fails on timing; what cannot run here is said, with why.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { V2Client } from '../src/client/v2-client.js';
import { DAEMON_NODE_FLAGS } from '../src/os/privileges/reexec.js';
import { MAX_GATED_READS } from '../src/os/proc-tasks.js';
import { FakeHost } from '../test/support/fake-host.js';
import { anchorProblem, C_HELPER, startAnchor, type Anchor } from './anchor.js';
import { startOurs, type Ours } from './ours.js';
import { median, percentile, printTable, ratioText, spreadText } from './stats.js';
import { buildTools, cpuSeconds, HELPER_BIN, rssMiB, runTool, type Tools } from './tools.js';

const REPEATS = 5;
const CLIENTS = [1, 16, 64, 256];
/** Seconds of load measured per helper, client count and repeat... */
const LOAD_S = 1.5;
/** ...and with one client, whose round trips are the fewest (a p99 from about 180 of 18 000 at 1.5 s). */
const LOAD_S_ONE_CLIENT = 3;
const loadSeconds = (clients: number) => (clients === 1 ? LOAD_S_ONE_CLIENT : LOAD_S);
/** Unmeasured load per helper and client count before a repeat's measurements. */
const WARMUP_S = 0.3;
/**
 * Unmeasured start of each slice: its connections are new (accept, peer check). legacy-load also waits
 * until each has been answered once, and reports that time apart (setup_ms).
 */
const SLICE_WARMUP_S = 0.05;
/**
 * Each of those measurements is cut into this many slices that alternate between the helpers
 * (A B B A A B ...), so that both see the same moments of this machine. Its noise comes in bursts
 * of 0.1 to 1 s in which most round trips of whichever helper runs are slow (seen with either
 * helper alone); with one 1.5 s run per helper, one side could get the quiet second. The slices of
 * a repeat are added up, and their round trips pooled.
 */
const SLICES = 6;
const VMS = 500;
/**
 * Sampling rounds per probe: one whole cycle of the forced full reads (MAX_GATED_READS), so that the
 * figure holds their share (about 1/29 of the processes read in full each interval) as the daemon
 * pays it over time.
 */
const SAMPLING_ROUNDS = String(MAX_GATED_READS);
const VCPUS = 8;

type Side = 'ours' | 'c';
interface Load {
  rps: number;
  cpuPerReqUs: number;
  p99: number;
  clientShare: number;
  /** The median slice's ms from its first connect() to the last connection's first reply. */
  setupMs: number;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** One slice of load: legacy-load's figures; its round trips are appended to `latFile`. */
function slice(tools: Tools, socket: string, pid: number, clients: number, latFile: string): Record<string, number> {
  return runTool(tools['legacy-load'], [
    socket,
    String(clients),
    String(loadSeconds(clients) / SLICES),
    String(SLICE_WARMUP_S),
    String(pid),
    latFile,
  ]);
}

/** A repeat's slices together: rates over their summed time, the p99 of all their round trips (µs). */
function combine(slices: Record<string, number>[], latencies: Uint32Array): Load {
  const sum = (k: string) => slices.reduce((n, f) => n + f[k]!, 0);
  return {
    rps: sum('requests') / sum('seconds'),
    cpuPerReqUs: (sum('server_cpu_s') / sum('requests')) * 1e6,
    p99: percentile(latencies, 99) / 1e3,
    clientShare: sum('client_cpu_s') / sum('seconds'),
    setupMs: median(slices.map((f) => f.setup_ms!)),
  };
}

/** Round trips (ns) that legacy-load appended to `file`. */
function readLatencies(file: string): Uint32Array {
  const b = fs.readFileSync(file);
  return new Uint32Array(b.buffer, b.byteOffset, b.length / 4).slice();
}

/** `n` stand-ins for QEMU processes, each with `threads` sleeping threads (its vCPUs). */
async function standIns(tools: Tools, n: number, threads: number): Promise<ChildProcess[]> {
  const kids: ChildProcess[] = [];
  for (let i = 0; i < n; i++) {
    const c = spawn(tools['idle-threads'], [String(threads)], { stdio: ['pipe', 'pipe', 'ignore'] });
    kids.push(c);
    await new Promise<void>((resolve, reject) => {
      c.stdout!.once('data', () => resolve());
      c.once('error', reject);
      c.once('exit', () => reject(new Error('idle-threads exited')));
    });
  }
  return kids;
}

/** 500 legacy connections held open (each made one request), as 500 QEMUs would hold them. */
async function holdConnections(tools: Tools, socket: string, n: number): Promise<ChildProcess> {
  const c = spawn(tools['legacy-load'], [socket, String(n), 'hold'], { stdio: ['pipe', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    c.stdout!.once('data', () => resolve());
    c.once('exit', (code) => reject(new Error(`legacy-load hold exited (${code})`)));
  });
  return c;
}

/** What every phase needs, and what the end of the run stops and removes whatever happened. */
interface Ctx {
  tools: Tools;
  host: FakeHost;
  /** Our helper's flags for the fake host. */
  hostArgs: string[];
  /** Sockets and round-trip files. */
  dir: string;
  /** Whether the C helper runs here, and whether it needs the gdb work-around for its vendor check. */
  withC: boolean;
  gdb: boolean;
  /** Helpers and clients to stop at the end, in reverse order. */
  started: { stop(): unknown }[];
  /** Processes to kill at the end. */
  kids: ChildProcess[];
}

/** Exec → listening figures (ms and CPU ms) per repeat: ours, the C helper's, and `node -e 0`'s. */
type StartTimes = Record<'ours' | 'c' | 'node', { ms: number[]; cpu: number[] }>;

/** Per-repeat figures of the sampling probe, ns per thread per interval. */
interface SamplingFigures {
  /** The C pread+parse floor. */
  floorNs: number[];
  /** Ours with its gates, on idle threads. */
  probeNs: number[];
  /** Ours reading and parsing every line (threads that ran). */
  everyLineNs: number[];
}

/** Per-repeat figures with 500 VMs: our daemon's CPU per interval, and both helpers' RSS. */
interface At500Figures {
  daemonMs: number[];
  rss: Record<Side, number[]>;
  anon: Record<Side, number[]>;
}

/** Per-repeat legacy load per client count (indexed as CLIENTS), and idle memory, of both helpers. */
interface LoadFigures {
  load: Record<Side, Load[][]>;
  idle: Record<Side, number[]>;
  idleAnon: Record<Side, number[]>;
}

type Figures = LoadFigures & { start: StartTimes; sampling: SamplingFigures; at500: At500Figures };

/** The fake host both helpers read: two packages, with RAPL units, power limit and energy set. */
function fakeHost(): FakeHost {
  const host = new FakeHost({ packages: [0, 0] });
  host.writePackageMsr(0, 0x606, 0xa0e03n);
  host.writePackageMsr(0, 0x610, 0x8000_0078_83c0n);
  host.writePackageMsr(0, 0x614, 0x3c0n);
  host.writePackageMsr(0, 0x611, 0x1234_5678n);
  return host;
}

/**
 * Legacy load and idle memory, with fresh helpers each repeat: idle RSS once past start-up, then
 * each client count in SLICES slices alternating between the helpers (which goes first alternates
 * with the repeat).
 */
async function legacyLoadAndIdle(ctx: Ctx): Promise<LoadFigures> {
  const { tools, dir, started } = ctx;
  const f: LoadFigures = {
    load: { ours: CLIENTS.map(() => []), c: CLIENTS.map(() => []) },
    idle: { ours: [], c: [] },
    idleAnon: { ours: [], c: [] },
  };
  for (let r = 0; r < REPEATS; r++) {
    const ours = await startOurs(path.join(dir, `ours-${r}.sock`), ctx.hostArgs);
    started.push(ours);
    let c: Anchor | undefined;
    if (ctx.withC) {
      c = await startAnchor(path.join(ctx.host.dir, 'dev/cpu'), path.join(dir, `c-${r}.sock`), ctx.gdb);
      started.push(c);
    }
    // Past start-up: ours gives memory back once it listens and again after discovery's first
    // scan of /proc (at most 2 s in); load measured during that would time our start-up, not a request.
    await sleep(3000);
    f.idle.ours.push(rssMiB(ours.pid));
    f.idleAnon.ours.push(rssMiB(ours.pid, 'RssAnon'));
    if (c) {
      f.idle.c.push(rssMiB(c.pid));
      f.idleAnon.c.push(rssMiB(c.pid, 'RssAnon'));
    }
    const order: [Side, Ours | Anchor][] = [['ours', ours]];
    if (c) order[r % 2 ? 'push' : 'unshift'](['c', c]);
    // Unmeasured, the same for both: each client count once. Ours faults back in the code pages
    // its start-up settling took out of its page tables (about 3000 minor faults here); measured
    // at once, they land in the first slice of the first client count.
    for (const n of CLIENTS)
      for (const [, h] of order) runTool(tools['legacy-load'], [h.socket, String(n), String(WARMUP_S), '0', String(h.pid)]);
    CLIENTS.forEach((n, i) => {
      const parts: Record<Side, Record<string, number>[]> = { ours: [], c: [] };
      const latFile = (side: Side) => path.join(dir, `trips-${side}-${n}-${r}`);
      for (let s = 0; s < SLICES; s++)
        for (const [side, h] of s % 2 ? [...order].reverse() : order) parts[side].push(slice(tools, h.socket, h.pid, n, latFile(side)));
      for (const [side] of order) {
        f.load[side][i]!.push(combine(parts[side], readLatencies(latFile(side))));
      }
    });
    await ours.stop();
    c?.stop();
  }
  return f;
}

/** Exec → listening (ours, as root: re-exec included); the C helper's exec → its vendor refusal; `node -e 0`. */
function execToListening(ctx: Ctx): StartTimes {
  const start: StartTimes = {
    ours: { ms: [], cpu: [] },
    c: { ms: [], cpu: [] },
    node: { ms: [], cpu: [] },
  };
  const timed = (who: keyof StartTimes, args: string[]) => {
    const f = runTool(ctx.tools['exec-to-listen'], args);
    start[who].ms.push(f.ms!);
    start[who].cpu.push(f.cpu_ms!);
  };
  for (let r = 0; r < REPEATS; r++) {
    const sock = path.join(ctx.dir, `start-${r}.sock`);
    timed('ours', [sock, '20000', process.execPath, HELPER_BIN, '-k', sock, ...ctx.hostArgs, '-q']);
    timed('node', ['-', '20000', process.execPath, '-e', '0']);
    if (fs.existsSync(C_HELPER)) timed('c', ['-', '20000', C_HELPER, '-V']);
  }
  return start;
}

/**
 * The sampling probe over `pids` (the 500 stand-ins'): ours (sampling-probe.ts, with its gates
 * and reading every line) against the C pread+parse floor (stat-floor), which goes first alternating.
 */
function samplingProbe(ctx: Ctx, pids: string[]): SamplingFigures {
  const f: SamplingFigures = { floorNs: [], probeNs: [], everyLineNs: [] };
  const probe = fileURLToPath(new URL('./sampling-probe.js', import.meta.url));
  for (let r = 0; r < REPEATS; r++) {
    const runFloor = () => f.floorNs.push(runTool(ctx.tools['stat-floor'], [SAMPLING_ROUNDS, ...pids]).ns_per_thread!);
    const runProbe = () => {
      f.probeNs.push(runTool(process.execPath, [...DAEMON_NODE_FLAGS, probe, SAMPLING_ROUNDS, ...pids]).ns_per_thread!);
      f.everyLineNs.push(runTool(process.execPath, [...DAEMON_NODE_FLAGS, probe, '--every-line', SAMPLING_ROUNDS, ...pids]).ns_per_thread!);
    };
    if (r % 2) {
      runFloor();
      runProbe();
    } else {
      runProbe();
      runFloor();
    }
  }
  return f;
}

/**
 * With 500 VMs: our daemon with the stand-ins `vms` registered (every thread a vCPU) and 500 legacy
 * connections held, its CPU per interval and RSS in steady state; then the C helper's RSS with 500
 * legacy connections held (it has no VMs to know of).
 */
async function daemonAt500Vms(ctx: Ctx, vms: ChildProcess[]): Promise<At500Figures> {
  const { tools, started, kids } = ctx;
  const f: At500Figures = { daemonMs: [], rss: { ours: [], c: [] }, anon: { ours: [], c: [] } };
  const ours = await startOurs(path.join(ctx.dir, 'ours-vms.sock'), ctx.hostArgs, ['--max-vms-per-connection', String(VMS)]);
  started.push(ours);
  const client = await V2Client.connect(ours.socket);
  started.push({ stop: () => client.close() });
  for (const k of vms) {
    const tids = fs
      .readdirSync(`/proc/${k.pid}/task`)
      .map(Number)
      .filter((t) => t !== k.pid);
    await client.register({ pid: k.pid!, vcpus: tids.map((tid, i) => ({ tid, vpkg: i % 2 })) });
  }
  const held = await holdConnections(tools, ours.socket, VMS);
  kids.push(held);
  // Steady state: the first samples open and read every thread (and the gates learn what is idle),
  // the first seconds also hold start-up garbage and compilation, and 10 to 15 s after the
  // registrations and connections V8's memory reducer shrinks the heap they grew (about 100 ms of
  // CPU, once); measured from 20 s on.
  await sleep(20_000);
  for (let r = 0; r < REPEATS; r++) {
    const c0 = cpuSeconds(ours.pid);
    const w0 = performance.now();
    await sleep(2000);
    f.daemonMs.push(((cpuSeconds(ours.pid) - c0) * 1e3) / ((performance.now() - w0) / 1000));
    f.rss.ours.push(rssMiB(ours.pid));
    f.anon.ours.push(rssMiB(ours.pid, 'RssAnon'));
  }
  held.stdin!.end();
  await client.close();
  await ours.stop();
  if (ctx.withC) {
    const c = await startAnchor(path.join(ctx.host.dir, 'dev/cpu'), path.join(ctx.dir, 'c-vms.sock'), ctx.gdb);
    started.push(c);
    const heldC = await holdConnections(tools, c.socket, VMS);
    kids.push(heldC);
    for (let r = 0; r < REPEATS; r++) {
      await sleep(300);
      f.rss.c.push(rssMiB(c.pid));
      f.anon.c.push(rssMiB(c.pid, 'RssAnon'));
    }
    heldC.stdin!.end();
    c.stop();
  }
  return f;
}

/** The legacy-load rows: req/s, CPU per request and p99 for each client count, ours beside the C helper's. */
function loadRows(withC: boolean, load: Record<Side, Load[][]>): string[][] {
  const C = (xs: number[], d: number) => (withC ? spreadText(xs, d) : 'n/a');
  const R = (o: number[], c: number[]) => (withC ? ratioText(o, c) : 'n/a');
  const col = (side: Side, i: number, k: keyof Load) => load[side][i]!.map((x) => x[k]);
  const rows: string[][] = [];
  const figure = (label: string, k: keyof Load, d: number, goal: string) =>
    CLIENTS.forEach((n, i) =>
      rows.push([
        `${label}, ${n} client${n > 1 ? 's' : ''}`,
        spreadText(col('ours', i, k), d),
        C(col('c', i, k), d),
        R(col('ours', i, k), col('c', i, k)),
        goal,
      ]),
    );
  figure('legacy req/s', 'rps', 0, '≥ 1.0');
  figure('legacy CPU µs/request', 'cpuPerReqUs', 2, '≤ 1.0');
  // Each repeat's p99 is that of the round trips of its slices; like every other row, the median
  // over the repeats, and the median of the per-repeat ratios (both helpers ran the same seconds).
  figure('legacy p99 µs', 'p99', 0, '≤ 1.0');
  const most = CLIENTS.length - 1;
  rows.push([
    `legacy: ${CLIENTS[most]} new connections, connect → each answered once, ms`,
    spreadText(col('ours', most, 'setupMs'), 1),
    C(col('c', most, 'setupMs'), 1),
    R(col('ours', most, 'setupMs'), col('c', most, 'setupMs')),
    '—',
  ]);
  return rows;
}

/** The rest of the table's rows: sampling, daemon CPU, memory idle and with 500 VMs, start-up. */
function otherRows(withC: boolean, f: Figures): string[][] {
  const C = (xs: number[]) => (withC ? spreadText(xs) : 'n/a');
  const R = (o: number[], c: number[]) => (withC ? ratioText(o, c) : 'n/a');
  const { floorNs, probeNs, everyLineNs } = f.sampling;
  const { idle, idleAnon, start } = f;
  const { rss, anon } = f.at500;
  const cStart = (xs: number[]) => (xs.length ? spreadText(xs) : 'n/a');
  return [
    [
      'sampling ns/thread/interval, idle threads (gates; C: pread+parse floor)',
      spreadText(probeNs, 0),
      spreadText(floorNs, 0),
      ratioText(probeNs, floorNs),
      '≤ 1.2',
    ],
    [
      '  every line read and parsed (threads that ran)',
      spreadText(everyLineNs, 0),
      spreadText(floorNs, 0),
      ratioText(everyLineNs, floorNs),
      '',
    ],
    [`daemon CPU ms per 1 s interval, ${VMS} VMs × ${VCPUS} vCPUs`, spreadText(f.at500.daemonMs, 1), '—', '—', '≤ 20 ms'],
    ['idle RSS MiB', spreadText(idle.ours), C(idle.c), R(idle.ours, idle.c), '≤ 45 MB'],
    [
      '  of it anonymous (RssAnon: heap, malloc; not shared file pages)',
      spreadText(idleAnon.ours),
      C(idleAnon.c),
      R(idleAnon.ours, idleAnon.c),
      '',
    ],
    [`RSS MiB, ${VMS} VMs (C: ${VMS} legacy connections)`, spreadText(rss.ours), C(rss.c), R(rss.ours, rss.c), '≤ 70 MB'],
    ['  of it anonymous', spreadText(anon.ours), C(anon.c), R(anon.ours, anon.c), ''],
    ['exec → listening ms (root, re-exec included)', spreadText(start.ours.ms), cStart(start.c.ms), '—', '≤ 200 ms'],
    ['  its CPU ms (user + system, to exit)', spreadText(start.ours.cpu), cStart(start.c.cpu), '—', ''],
  ];
}

/** The table, then what the load generator cost, the C start-up column's meaning and how long the suite took (since `t0`). */
function printFigures(withC: boolean, f: Figures, t0: number): void {
  const header = ['figure', 'ours', 'C helper', 'ours ÷ C', 'goal'];
  console.log();
  printTable([header, ...loadRows(withC, f.load), ...otherRows(withC, f)]);
  const maxShare = Math.max(...(['ours', 'c'] as const).flatMap((s) => f.load[s].flat().map((x) => x.clientShare)));
  console.log(
    `\n  Load generator: one C process (bench/native/legacy-load.c) for both, at most ${(maxShare * 100).toFixed(0)} % of a core. ` +
      `C start-up column: exec → its vendor refusal (-V), a lower bound of its exec → listening; node -e 0 takes ${median(f.start.node.ms).toFixed(0)} ms (${median(f.start.node.cpu).toFixed(0)} ms CPU) here.`,
  );
  console.log(
    '  Each slice is measured once every connection has been answered once; the time that took is its own row (no goal: QEMU connects once per VM). ' +
      "The C helper's short listen backlog makes connect() wait for its accept, which that row counts for both.",
  );
  console.log(
    `  ${REPEATS} repeats, ${LOAD_S} s of load per helper and client count in each (${LOAD_S_ONE_CLIENT} s with one client), in ${SLICES} alternating slices; this suite took ${((Date.now() - t0) / 1000).toFixed(0)} s.`,
  );
}

export async function run(): Promise<void> {
  console.log('\n== performance table: ours ÷ QEMU 10.0.2 C qemu-vmsr-helper (median of 5 repeats, alternating; (min–max))');
  const tools = buildTools();
  if ('unavailable' in tools) {
    console.log(`  cannot run: ${tools.unavailable}`);
    return;
  }
  const a = anchorProblem();
  if ('problem' in a) console.log(`  anchor unavailable: ${a.problem}; only our own figures are printed`);
  const host = fakeHost();
  const ctx: Ctx = {
    tools,
    host,
    hostArgs: ['--msr-path', host.msrPathTemplate, '--sys-root', host.sysRoot, '--vendor', 'intel'],
    dir: fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-bench-cmp-')),
    withC: !('problem' in a),
    gdb: 'gdb' in a && a.gdb,
    started: [],
    kids: [],
  };
  const t0 = Date.now();
  try {
    const loadAndIdle = await legacyLoadAndIdle(ctx);
    const start = execToListening(ctx);
    const vms = await standIns(tools, VMS, VCPUS);
    ctx.kids.push(...vms);
    const pids = vms.map((k) => String(k.pid!));
    const sampling = samplingProbe(ctx, pids);
    const at500 = await daemonAt500Vms(ctx, vms);
    printFigures(ctx.withC, { ...loadAndIdle, start, sampling, at500 }, t0);
  } catch (e) {
    console.log(`  could not finish: ${(e as Error).message}`);
  } finally {
    for (const s of ctx.started.reverse()) await Promise.resolve(s.stop()).catch(() => {});
    for (const k of ctx.kids) k.kill('SIGKILL');
    host.cleanup();
    fs.rmSync(ctx.dir, { recursive: true, force: true });
    fs.rmSync(tools.dir, { recursive: true, force: true });
  }
}
