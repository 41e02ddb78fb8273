/** `vmsr-helper record` (docs/recording.md): a trace of the given VMs until SIGINT/SIGTERM/--duration; a VM that ends is absent. */
import { type Command } from 'commander';
import { MsrDevice, msrErrorWithHint } from '../../msr/device.js';
import type { EnergyDomain, EnergySource } from '../../energy/energy-source.js';
import { createEnergySource, readHostInfoFor, readsMsrs, withDomainCounters } from '../../energy/create.js';
import type { EnergySourceChoice, EnergySourceKind } from '../../energy/kinds.js';
import { chooseEnergySource } from '../../energy/choose.js';
import { readHostCpus } from '../../msr/topology.js';
import { readVendor } from '../../msr/vendor.js';
import type { HostPaths } from '../../msr/host-paths.js';
import type { Vendor, HostInfo } from '../../model/host.js';
import type { VcpuSpec } from '../../model/vcpus.js';
import type { VmSpec } from '../../model/vm.js';
import { ProcTaskReader } from '../../os/proc-tasks.js';
import { Sampler } from '../../sampling/sampler.js';
import { monotonicNs, TickLoop } from '../../sampling/tick-loop.js';
import { DisposableStore } from '../../common/disposable.js';
import { onStopSignals } from '../stop-signals.js';
import { TraceWriter } from '../../trace/writer.js';
import { vmSpecFromArgs } from '../../os/vm-threads.js';
import { vmSpecFromQmp } from '../../client/qmp.js';
import { clockTicksPerSecond } from '../../os/libc/processes.js';
import { V2Client } from '../../client/v2-client.js';
import { findVm } from '../../client/find-vm.js';
import { ProcScanner } from '../../discovery/scanner.js';
import { cannotError } from '../../common/errors.js';
import { statedHost } from '../../client/stated-energy-source.js';
import {
  addClientSocketOption,
  addHostOptions,
  clientSocket,
  collect,
  commandOptions,
  domainsOption,
  energySourceOption,
  hostOptionsFrom,
  intervalArg,
  pidArg,
  secondsArg,
  vcpuListArg,
  type RawHostOptions,
} from '../options.js';
import { VERSION } from '../version.js';
import { UsageError } from '../cli-errors.js';
import { ProgressLine } from '../progress.js';

const SYNTHETIC_ALTERNATIVE = 'use --energy-source synthetic to record without RAPL';

/** The options as parsed; `vcpus` pairs with `pid` by position. */
interface RecordOptions {
  vm?: string[];
  socket?: string;
  qmp: string[];
  pid: number[];
  vcpus: VcpuSpec[][];
  output: string;
  interval: number;
  duration?: number;
  energySource: EnergySourceChoice;
  domains?: EnergyDomain[];
  paths: HostPaths;
  vendor?: Vendor;
  note?: string;
  force?: boolean;
}

/** A progress line every this many samples when stderr is not a TTY. */
const PROGRESS_EVERY = 10;

export function addRecordCommand(program: Command): void {
  const record = program
    .command('record')
    .description('record a trace of package energy and VM thread stats, for replay')
    .option(
      '--vm <vm>',
      "a VM the helper lists, by name ('virsh list'), UUID or PID: its threads from discovery (repeatable)",
      collect(String),
      [],
    )
    .option('--qmp <path>', 'QMP socket of a QEMU VM to register (repeatable)', collect(String), [])
    .option('--pid <pid>', 'pid of a VM process to register; pair with --vcpus (repeatable)', collect(pidArg), [])
    .option('--vcpus <list>', 'vCPU threads of the matching --pid: TID:VPKG,TID:VPKG,...', collect(vcpuListArg), [])
    .requiredOption(
      '-o, --output <trace>',
      'trace file to write (.jsonl, or .jsonl.gz for gzip); an existing file is refused without --force',
    )
    .option('--force', 'overwrite the output file if it exists')
    // At least 10 ms, as the daemon's --interval: a period that rounds to 0 ns would never advance the deadline.
    .option('--interval <seconds>', 'time between samples', intervalArg('--interval'), 1)
    .option('--duration <seconds>', 'stop after this long (default: until SIGINT/SIGTERM)', secondsArg('--duration', { max: 366 * 86400 }))
    .addOption(energySourceOption('with --vm, the source the helper states; else msr when an MSR device opens, else powercap'))
    .addOption(domainsOption());
  addHostOptions(addClientSocketOption(record))
    .option('--note <text>', 'free text for the trace header (where and how it was captured)')
    .action(async (_local: unknown, cmd: Command) => {
      const o = commandOptions<Omit<RecordOptions, 'paths' | 'vendor'> & RawHostOptions>(cmd);
      const { paths, vendor } = hostOptionsFrom(o);
      await runRecord({ ...o, paths, vendor: vendor === 'auto' ? undefined : vendor });
    });
}

/** `record --vm`: the listed VMs' threads from /proc here (refused for a process not the one listed: a reused pid), and the helper's energy source. */
async function vmSpecsFromHelper(
  socketPath: string,
  targets: readonly string[],
  procRoot: string,
  clkTck: number,
): Promise<{ vms: VmSpec[]; energySource: EnergySourceKind | null }> {
  if (targets.length === 0) return { vms: [], energySource: null };
  const client = await V2Client.connect(socketPath);
  let listed;
  let energySource;
  try {
    listed = await client.list();
    energySource = (await statedHost(client)).energySource;
  } finally {
    await client.close();
  }
  const picked = targets.map((t) => ({ target: t, vm: findVm(listed, t, 'vmsr-helper record --vm') }));
  const found = new ProcScanner(procRoot, { clkTck }).scan();
  const vms = picked.map(({ target, vm }) => {
    const d = found.find((f) => f.pid === vm.pid && BigInt(f.starttime) === vm.starttime);
    if (d === undefined) {
      throw cannotError(
        `record the VM ${JSON.stringify(target)} (pid ${vm.pid})`,
        vm.ended
          ? 'it has ended'
          : 'its process is not a VM to this scan of /proc (it ended, or the helper was given its threads by a client)',
        `give its threads with --pid ${vm.pid} --vcpus TID:VPKG,...`,
      );
    }
    return { pid: d.pid, starttime: d.starttime, vcpus: d.vcpus, ...(d.name !== null ? { name: d.name } : {}) };
  });
  return { vms, energySource };
}

/** The VMs to record, and the energy source the helper states when --vm asked it (null: not asked or not said). */
async function collectVms(o: RecordOptions): Promise<{ vms: VmSpec[]; stated: EnergySourceKind | null }> {
  if (o.pid.length !== o.vcpus.length)
    throw new UsageError(`every --pid needs its --vcpus (got ${o.pid.length} --pid and ${o.vcpus.length} --vcpus)`);
  const targets = o.vm ?? [];
  if (targets.length === 0 && o.qmp.length === 0 && o.pid.length === 0)
    throw new UsageError('nothing to record: give --vm NAME|UUID|PID, --qmp PATH or --pid PID --vcpus TID:VPKG,...');
  const fromHelper = await vmSpecsFromHelper(clientSocket(o), targets, o.paths.procRoot, clockTicksPerSecond());
  const vms = fromHelper.vms;
  for (const p of o.qmp) vms.push(await vmSpecFromQmp(p, o.paths.procRoot));
  o.pid.forEach((pid, i) => {
    try {
      vms.push(vmSpecFromArgs(o.paths.procRoot, pid, o.vcpus[i]!));
    } catch (e) {
      throw new Error(`--pid ${pid}: ${(e as Error).message}`);
    }
  });
  const twice = vms.find((vm, i) => vms.findIndex((v) => v.pid === vm.pid) !== i);
  if (twice) throw new Error(`process ${twice.pid} is given twice (same VM through two options?)`);
  return { vms, stated: fromHelper.energySource };
}

function defaultNote(o: RecordOptions, energy: EnergySource, vms: VmSpec[]): string {
  const who = vms.map((v) => `${v.name ?? `pid ${v.pid}`} (${v.vcpus.length} vCPUs)`).join(', ');
  return `${o.note ? `${o.note}; ` : ''}recorded by vmsr-helper ${VERSION} record; ${energy.describe()}; VMs: ${who}`;
}

/** Records until the duration elapses or SIGINT/SIGTERM; resolves once the trace is complete on disk. */
async function runRecord(o: RecordOptions): Promise<void> {
  const { vms, stated } = await collectVms(o);
  // auto beside a helper that states its source (--vm): the same energy as the helper reads, synthetic included.
  if (o.energySource === 'auto' && stated !== null) o = { ...o, energySource: stated };
  const device = new MsrDevice(o.paths.msrPathTemplate);
  const tasks = new ProcTaskReader(o.paths.procRoot);
  let energy: EnergySource | null = null;
  let writer: TraceWriter | null = null;
  const signals = new DisposableStore();
  try {
    const opened = openEnergy(o, device);
    energy = opened.energy;
    const sampler = new Sampler(energy, tasks);
    writer = TraceWriter.open(o.output, { host: opened.host, note: defaultNote(o, energy, vms) }, { overwrite: o.force === true });
    const w = writer;

    const tReg = monotonicNs();
    for (const vm of vms) w.register(tReg, vm);
    const alive = new Set(vms.map((v) => v.pid));
    const takeSample = sampleInto(w, sampler, tasks, alive, opened.msr);
    const progress = new ProgressLine();
    const text = () => `record: ${w.samples} samples, ${alive.size}/${vms.length} VMs alive, ${w.bytesWritten} bytes written`;
    const report = () => progress.show(text(), w.samples === 1 || w.samples % PROGRESS_EVERY === 0);

    takeSample(); // the baseline
    report();
    await sampleUntilStopped(o, signals, () => {
      takeSample();
      report();
    });
    progress.done(`${text()}; done`);
  } finally {
    signals.dispose();
    if (writer) await writer.close();
    energy?.close();
    tasks.close();
    device.close();
  }
}

/** The energy source and its host, read once so an unreadable register fails before the trace exists (`msr`: hint synthetic). */
function openEnergy(o: RecordOptions, device: MsrDevice): { energy: EnergySource; host: HostInfo; msr: boolean } {
  const vendor = o.vendor ?? readVendor(o.paths.procRoot);
  const cpus = readHostCpus(o.paths.sysRoot);
  const kind = chooseEnergySource(o.energySource, { ...o.paths, cpus, vendor }).kind;
  const msr = readsMsrs(kind);
  let host: HostInfo;
  try {
    host = readHostInfoFor(kind, { paths: o.paths, device, vendor });
  } catch (e) {
    throw msrErrorWithHint(e, SYNTHETIC_ALTERNATIVE);
  }
  let energy: EnergySource | undefined;
  try {
    energy = createEnergySource(kind, { host, paths: o.paths, device, domains: o.domains });
    host = withDomainCounters(host, energy);
    if (msr) energy.read(); // fail before creating the trace when the energy register is unreadable
  } catch (e) {
    energy?.close();
    throw msr ? msrErrorWithHint(e, SYNTHETIC_ALTERNATIVE) : e;
  }
  return { energy, host, msr };
}

/** One sample into the trace; a VM whose process ended leaves `alive` (and is never read again). */
function sampleInto(w: TraceWriter, sampler: Sampler, tasks: ProcTaskReader, alive: Set<number>, msr: boolean): () => void {
  return () => {
    let s;
    try {
      s = sampler.sample(alive);
    } catch (e) {
      throw msr ? msrErrorWithHint(e, SYNTHETIC_ALTERNATIVE) : e;
    }
    for (const pid of alive) {
      // Once gone, never read again: the pid could be reused by an unrelated process.
      if (!s.tasks.has(pid)) {
        alive.delete(pid);
        tasks.forget(pid);
      }
    }
    w.sample(s);
  };
}

/** Runs `tick` every --interval until --duration elapses or SIGINT/SIGTERM; rejects with a tick's error. */
function sampleUntilStopped(o: RecordOptions, signals: DisposableStore, tick: () => void): Promise<void> {
  const intervalNs = BigInt(Math.round(o.interval * 1e9));
  return new Promise<void>((resolve, reject) => {
    // Ticks at start + k x interval (sampling/tick-loop.ts): a slow sample does not shift later ones.
    const loop = new TickLoop({ intervalNs, tick, onError: (e) => finish(e) });
    const finish = (e?: unknown) => {
      loop.stop();
      signals.dispose();
      if (e) reject(e);
      else resolve();
    };
    signals.add(onStopSignals(() => finish()));
    const start = monotonicNs();
    const endNs = o.duration === undefined ? undefined : start + BigInt(Math.round(o.duration * 1e9));
    loop.start({ ...(endNs !== undefined ? { endNs } : {}), onEnd: () => finish() });
  });
}
