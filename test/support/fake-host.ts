/**
 * THE fake host of the tests and the bench: a host whose RAPL registers are files. This machine has
 * no /dev/cpu/N/msr, so each CPU gets a sparse file read through the real code path (pread at
 * offset = MSR number). sysfs is faked too, so tests choose the topology; /proc stays the real one.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { msrPath, type HostPaths } from '../../src/msr/host-paths.js';
import { MSR_AMD_PKG_ENERGY_STATUS, MSR_AMD_RAPL_POWER_UNIT, MSR_PKG_ENERGY_STATUS, MSR_RAPL_POWER_UNIT } from '../../src/msr/registers.js';
import type { Vendor } from '../../src/model/host.js';
import type { Logger } from 'pino';
import { assembleV2, type V2Chain, type V2ChainOptions } from '../../src/helper/assemble.js';
import { readStarttime } from '../../src/os/proc-starttime.js';
import { openListener } from '../../src/helper/server/listener.js';
import { checkTopology } from '../../src/helper/lifecycle/startup-checks.js';
import { HelperServer, lateV2Handler } from '../../src/helper/server/server.js';
import { LegacyService, OnlineCpus } from '../../src/helper/legacy/legacy-service.js';
import type { MsrDevice } from '../../src/msr/device.js';
import { DEFAULT_AMD_SYNTH } from '../../src/msr/legacy-registers.js';
import type { TraceSink } from '../../src/sampling/sampling-service.js';
import type { V2Limits } from '../../src/helper/v2/v2-limits.js';

/**
 * The powercap zones of a two-package Intel host as the kernel lays them out: package-0 with core,
 * uncore and dram sub-zones, psys as a top-level zone between the packages (intel-rapl:1), package-1
 * (intel-rapl:2) with the same sub-zones. `id` as FakeHost.writePowercap takes it.
 */
export const TWO_PACKAGE_ZONES: readonly { id: string; name: string }[] = [
  { id: '0', name: 'package-0' },
  { id: '0:0', name: 'core' },
  { id: '0:1', name: 'uncore' },
  { id: '0:2', name: 'dram' },
  { id: '1', name: 'psys' },
  { id: '2', name: 'package-1' },
  { id: '2:0', name: 'core' },
  { id: '2:1', name: 'uncore' },
  { id: '2:2', name: 'dram' },
];

export interface FakeHostOptions {
  /** package id of each CPU, index = CPU number; default two CPUs in package 0. */
  packages?: number[];
  /** CPUs listed as online in sysfs; default all. */
  online?: number[];
  /** core_id of each CPU (SMT siblings share one within a package); default each CPU a core of its own. */
  coreIds?: number[];
}

export class FakeHost {
  readonly dir: string;
  readonly sysRoot: string;
  readonly msrPathTemplate: string;
  readonly cpuPackages: number[];

  constructor(opts: FakeHostOptions = {}) {
    this.cpuPackages = opts.packages ?? [0, 0];
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-fakehost-'));
    this.sysRoot = path.join(this.dir, 'sys');
    this.msrPathTemplate = path.join(this.dir, 'dev/cpu/%u/msr');
    const online = opts.online ?? this.cpuPackages.map((_, i) => i);
    const cpuDir = path.join(this.sysRoot, 'devices/system/cpu');
    fs.mkdirSync(cpuDir, { recursive: true });
    fs.writeFileSync(path.join(cpuDir, 'online'), `${online.join(',')}\n`);
    this.cpuPackages.forEach((pkg, cpu) => {
      fs.mkdirSync(path.join(cpuDir, `cpu${cpu}/topology`), { recursive: true });
      fs.writeFileSync(path.join(cpuDir, `cpu${cpu}/topology/physical_package_id`), `${pkg}\n`);
      fs.writeFileSync(path.join(cpuDir, `cpu${cpu}/topology/core_id`), `${opts.coreIds?.[cpu] ?? cpu}\n`);
      fs.mkdirSync(path.dirname(this.msrPath(cpu)), { recursive: true });
      fs.writeFileSync(this.msrPath(cpu), '');
    });
  }

  msrPath(cpu: number): string {
    return msrPath(this.msrPathTemplate, cpu);
  }

  /** Writes an MSR value as the kernel would return it: 8 little-endian bytes at offset = MSR. */
  writeMsr(cpu: number, msr: number, value: bigint): void {
    const buf = Buffer.alloc(8);
    buf.writeBigUInt64LE(BigInt.asUintN(64, value));
    const fd = fs.openSync(this.msrPath(cpu), 'r+');
    try {
      fs.writeSync(fd, buf, 0, 8, msr);
    } finally {
      fs.closeSync(fd);
    }
  }

  /**
   * Writes only bits 31:0 of an energy counter on each of `cpus` (4 bytes at offset = MSR). The upper
   * half is reserved in hardware, and in a sparse file the 8 bytes of one MSR overlap its neighbours
   * (0x611 covers 0x614's low byte), so a running counter stays out of them as long as its top byte
   * does not change.
   */
  writeCounter32(cpus: readonly number[], msr: number, value: number): void {
    const buf = Buffer.alloc(4);
    buf.writeUInt32LE(value >>> 0);
    for (const cpu of cpus) {
      const fd = fs.openSync(this.msrPath(cpu), 'r+');
      try {
        // the device always returns 8 bytes: keep the file long enough for a read of this MSR
        if (fs.fstatSync(fd).size < msr + 8) fs.ftruncateSync(fd, msr + 8);
        fs.writeSync(fd, buf, 0, 4, msr);
      } finally {
        fs.closeSync(fd);
      }
    }
  }

  /** The CPUs of a package. */
  cpusOf(pkg: number): number[] {
    return this.cpuPackages.flatMap((p, cpu) => (p === pkg ? [cpu] : []));
  }

  /** A package's counter, bits 31:0 on each of its CPUs (package-scope registers). */
  writePackageCounter32(pkg: number, msr: number, value: number): void {
    this.writeCounter32(this.cpusOf(pkg), msr, value);
  }

  /** Same MSR value on every CPU of a package (package-scope registers). */
  writePackageMsr(pkg: number, msr: number, value: bigint): void {
    this.cpuPackages.forEach((p, cpu) => {
      if (p === pkg) this.writeMsr(cpu, msr, value);
    });
  }

  /** The paths the helper is pointed at: these MSR files and sysfs, the given (default real) /proc. */
  hostPaths(procRoot = '/proc'): HostPaths {
    return { msrPathTemplate: this.msrPathTemplate, procRoot, sysRoot: this.sysRoot };
  }

  /** Command-line options pointing the helper at this host. */
  cliArgs(vendor: Vendor = 'intel'): string[] {
    return ['--msr-path', this.msrPathTemplate, '--sys-root', this.sysRoot, '--vendor', vendor];
  }

  /** Counter values by "msr cpus". */
  private readonly counters = new Map<string, number>();

  /**
   * The RAPL registers of the vendor's layout: the power unit on every package, and the 32-bit
   * energy counter of the packages given (units of 2^-ESU J).
   */
  writeRapl(o: { vendor?: Vendor; powerUnit: bigint; energy?: Record<number, number> }): void {
    const vendor = o.vendor ?? 'intel';
    for (const pkg of new Set(this.cpuPackages))
      this.writePackageMsr(pkg, vendor === 'amd' ? MSR_AMD_RAPL_POWER_UNIT : MSR_RAPL_POWER_UNIT, o.powerUnit);
    for (const [pkg, units] of Object.entries(o.energy ?? {})) this.setEnergy(Number(pkg), units, vendor);
  }

  /** Sets a 32-bit energy counter `msr` read through `cpus` (a package's CPUs, or one core's), wrapping as the hardware's does. */
  setCounter(cpus: readonly number[], msr: number, units: number): void {
    const v = units >>> 0;
    this.counters.set(`${msr} ${cpus.join(',')}`, v);
    this.writeCounter32(cpus, msr, v);
  }

  /** Adds to the counter setCounter set, wrapping at 32 bits. */
  addCounter(cpus: readonly number[], msr: number, units: number): void {
    this.setCounter(cpus, msr, (this.counters.get(`${msr} ${cpus.join(',')}`) ?? 0) + units);
  }

  /** Sets a package's energy counter (wrapping at 32 bits, as the hardware's does). */
  setEnergy(pkg: number, units: number, vendor: Vendor = 'intel'): void {
    this.setCounter(this.cpusOf(pkg), vendor === 'amd' ? MSR_AMD_PKG_ENERGY_STATUS : MSR_PKG_ENERGY_STATUS, units);
  }

  /** Adds to a package's energy counter, wrapping at 32 bits. */
  addEnergy(pkg: number, units: number, vendor: Vendor = 'intel'): void {
    this.addCounter(this.cpusOf(pkg), vendor === 'amd' ? MSR_AMD_PKG_ENERGY_STATUS : MSR_PKG_ENERGY_STATUS, units);
  }

  /**
   * Steady package power: the power unit on every package (default ESU 14), then `units` added to
   * package `pkg`'s 32-bit energy counter (wrapping from `start`) every `everyMs`. Returns the stop.
   */
  pumpEnergy(o: { pkg?: number; powerUnit?: bigint; start?: number; units: number; everyMs: number }): () => void {
    const pkg = o.pkg ?? 0;
    this.writeRapl({ powerUnit: o.powerUnit ?? 0xa0e03n, energy: { [pkg]: o.start ?? 0 } });
    const t = setInterval(() => this.addEnergy(pkg, o.units), o.everyMs);
    return () => clearInterval(t);
  }

  /** Zone id ("0", "0:1") -> its max_energy_range_uj and energy_uj now. */
  private readonly zones = new Map<string, { max: bigint; uj: bigint }>();

  /**
   * The kernel's powercap tree (Documentation/power/powercap/powercap.rst) under this host's sysfs:
   * devices/virtual/powercap/intel-rapl/intel-rapl:N[/intel-rapl:N:M] holding name, energy_uj and
   * max_energy_range_uj, each zone linked from class/powercap/intel-rapl:N[:M], and the control type's
   * own entry (intel-rapl, not a zone). `id` is "N" or "N:M"; energy_uj wraps to 0 after max.
   */
  writePowercap(zones: { id: string; name: string; max: bigint; uj: bigint }[]): void {
    const typeDir = path.join(this.sysRoot, 'devices/virtual/powercap/intel-rapl');
    const classDir = path.join(this.sysRoot, 'class/powercap');
    fs.mkdirSync(classDir, { recursive: true });
    fs.mkdirSync(typeDir, { recursive: true });
    fs.writeFileSync(path.join(typeDir, 'enabled'), '1\n');
    if (!fs.existsSync(path.join(classDir, 'intel-rapl'))) fs.symlinkSync(typeDir, path.join(classDir, 'intel-rapl'));
    for (const z of zones) {
      const dir = this.powercapZoneDir(z.id);
      fs.mkdirSync(dir, { recursive: true });
      fs.writeFileSync(path.join(dir, 'name'), `${z.name}\n`);
      fs.writeFileSync(path.join(dir, 'max_energy_range_uj'), `${z.max}\n`);
      fs.symlinkSync(dir, path.join(classDir, `intel-rapl:${z.id}`));
      this.zones.set(z.id, { max: z.max, uj: 0n });
      this.setZoneEnergy(z.id, z.uj);
    }
  }

  /** A zone's directory (its parent zone's for a sub-zone), as the kernel nests them. */
  powercapZoneDir(id: string): string {
    const parts = id.split(':');
    const typeDir = path.join(this.sysRoot, 'devices/virtual/powercap/intel-rapl');
    return parts.length === 1 ? path.join(typeDir, `intel-rapl:${id}`) : path.join(typeDir, `intel-rapl:${parts[0]}`, `intel-rapl:${id}`);
  }

  /**
   * Sets a zone's energy_uj (modulo max_energy_range_uj + 1: it wraps to 0 after max). Rewritten in
   * place, so an open fd sees it, and without emptying the file first, so a daemon reading meanwhile
   * never sees "". The value only grows until it wraps; a shorter one (after a wrap) is cut to its
   * length right after it is written, and a read in between would see the old value's tail after it.
   */
  setZoneEnergy(id: string, uj: bigint): void {
    const z = this.zones.get(id)!;
    z.uj = uj % (z.max + 1n);
    const text = Buffer.from(`${z.uj}\n`);
    const fd = fs.openSync(path.join(this.powercapZoneDir(id), 'energy_uj'), fs.constants.O_WRONLY | fs.constants.O_CREAT);
    try {
      fs.writeSync(fd, text, 0, text.length, 0);
      fs.ftruncateSync(fd, text.length);
    } finally {
      fs.closeSync(fd);
    }
  }

  /** Adds µJ to a zone's energy_uj, wrapping after max_energy_range_uj. */
  addZoneEnergy(id: string, uj: bigint): void {
    this.setZoneEnergy(id, this.zones.get(id)!.uj + uj);
  }

  cleanup(): void {
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * The legacy service alone on a fake host (Intel, CPUs 0 and 1 online, the real /proc), reading its
 * MSR files through `device`: what the server's tests and the legacy bench answer requests with.
 */
export function legacyOnFakeHost(fake: FakeHost, device: MsrDevice, logger: Logger): LegacyService {
  return new LegacyService({
    device,
    vendor: 'intel',
    procRoot: '/proc',
    cpus: new OnlineCpus(fake.sysRoot, [0, 1]),
    amd: DEFAULT_AMD_SYNTH,
    logger,
  });
}

/** The whole chain on a fake host, serving: the v2 chain, the server and the legacy service. */
export interface Chain extends V2Chain {
  server: HelperServer;
  legacy: LegacyService;
  /** Closes the v2 service, then the server. */
  close(): Promise<void>;
}

/**
 * The daemon's service chain on a fake host, listening on `socketPath`, built as the daemon builds it
 * (lifecycle/phases.ts): the topology checked, the legacy service and the server serving with a late v2
 * handler, then the v2 chain (assembleV2) on the server's health figures, its handler bound. What the
 * v2 tests and the bench run in-process, minus the daemon's lifecycle (checks, privilege drop,
 * signals). Intel layout, real /proc.
 */
export async function assembleOnFakeHost(
  fake: FakeHost,
  device: MsrDevice,
  o: { socketPath: string; intervalMs: number; limits: V2Limits; trace?: TraceSink; log: Logger } & Pick<
    V2ChainOptions,
    'discovery' | 'observerGid' | 'fds' | 'restore' | 'restoreWaitMs'
  >,
): Promise<Chain> {
  const paths = fake.hostPaths();
  const listener = await openListener({ path: o.socketPath });
  const late = lateV2Handler();
  const legacy = new LegacyService({
    device,
    vendor: 'intel',
    procRoot: paths.procRoot,
    cpus: new OnlineCpus(
      paths.sysRoot,
      checkTopology(paths.sysRoot).map((c) => c.cpu),
    ),
    amd: DEFAULT_AMD_SYNTH,
    logger: o.log,
  });
  const server = new HelperServer({
    listener,
    legacy,
    logger: o.log,
    starttimeOf: (pid) => readStarttime(paths.procRoot, pid),
    v2Handler: late.handler,
  });
  const health = { legacy: legacy.counters, connections: () => server.connections };
  server.serve();
  let v2: V2Chain;
  try {
    v2 = await assembleV2({
      paths,
      device,
      vendor: 'intel',
      intervalMs: o.intervalMs,
      limits: o.limits,
      trace: () => o.trace,
      log: o.log,
      health,
      ...(o.discovery !== undefined ? { discovery: o.discovery } : {}),
      ...(o.observerGid !== undefined ? { observerGid: o.observerGid } : {}),
      ...(o.fds ? { fds: o.fds } : {}),
      ...(o.restore ? { restore: o.restore } : {}),
      ...(o.restoreWaitMs !== undefined ? { restoreWaitMs: o.restoreWaitMs } : {}),
    });
  } catch (e) {
    await server.close();
    throw e;
  }
  late.bind(v2.service.handler);
  return {
    ...v2,
    legacy,
    server,
    async close() {
      await v2.close();
      await server.close();
    },
  };
}
