/**
 * The exposition, read from the EnergyBook at scrape time: the per-VM families by VmExposition, the rest prom-client metrics in
 * a Registry per format (prom-client renames a counter in place when it renders OpenMetrics: the formats cannot share one).
 */
import { Counter, Gauge, Registry, type RegistryContentType } from 'prom-client';
import type { EnergyBook } from './energy-book.js';
import { ujToJoules, type RunningTotal } from './running-total.js';
import { VM_FAMILIES, VmExposition, type ExpositionFormat } from './vm-exposition.js';
import { addCapacityFamilies } from './helper-capacity.js';
import { processRegistry } from './process-metrics.js';

const CONTENT_TYPES: Record<ExpositionFormat, RegistryContentType> = {
  prometheus: Registry.PROMETHEUS_CONTENT_TYPE,
  openmetrics: Registry.OPENMETRICS_CONTENT_TYPE,
};

/** The metric names, once (docs and tests use them too). */
export const METRIC = {
  vmEnergy: VM_FAMILIES.energy.name,
  vmPower: VM_FAMILIES.power.name,
  vmInfo: VM_FAMILIES.info.name,
  packageEnergy: 'vmsr_host_package_energy_joules_total',
  unattributedEnergy: 'vmsr_unattributed_energy_joules_total',
  packageUnattributedEnergy: 'vmsr_host_package_unattributed_energy_joules_total',
  legacyRequests: 'vmsr_helper_legacy_requests_total',
  daemonConnections: 'vmsr_helper_connections',
  daemonVms: 'vmsr_helper_vms',
  samples: 'vmsr_helper_samples_total',
  sampleFailures: 'vmsr_helper_sample_failures_total',
  sampleDuration: 'vmsr_helper_sample_duration_seconds',
  lastSampleAge: 'vmsr_helper_last_sample_age_seconds',
  up: 'vmsr_exporter_helper_connected',
  connects: 'vmsr_exporter_helper_connects_total',
  vmsSkipped: 'vmsr_exporter_vms_skipped',
  energySource: 'vmsr_energy_source_info',
} as const;

/**
 * Per format and host view (with the host families or without), the content type and a scrape's body; the VMs' label text,
 * the process metrics and vmsr_build_info (process-metrics.ts) are shared by a format's views.
 */
export function buildExpositions(book: EnergyBook) {
  const vms = new VmExposition(book);
  const processRegistries = {
    prometheus: processRegistry(CONTENT_TYPES.prometheus),
    openmetrics: processRegistry(CONTENT_TYPES.openmetrics),
  };
  const one = (format: ExpositionFormat, withHost: boolean) => {
    const registry = buildRegistry(book, format, withHost);
    const own = processRegistries[format];
    // Joined as prom-client joins families (a blank line; OpenMetrics: a newline), the VM families first, then the book's
    // body (OpenMetrics: less its # EOF), then the process registry's.
    const open = format === 'openmetrics';
    const sep = open ? '\n' : '\n\n';
    return {
      contentType: registry.contentType,
      render: async () => {
        const [main, proc] = await Promise.all([registry.metrics(), own.metrics()]);
        return `${vms.render(format)}${sep}${open ? main.slice(0, -'# EOF\n'.length) : `${main}\n`}${proc}`;
      },
    };
  };
  return {
    withHost: { prometheus: one('prometheus', true), openmetrics: one('openmetrics', true) },
    withoutHost: { prometheus: one('prometheus', false), openmetrics: one('openmetrics', false) },
  };
}

/** The host and health families (everything but the per-VM ones); the host families only `withHost`. */
function buildRegistry(book: EnergyBook, format: ExpositionFormat, withHost: boolean): Registry<RegistryContentType> {
  const registry = new Registry<RegistryContentType>();
  registry.setContentType(CONTENT_TYPES[format]);
  const registers = [registry];
  if (withHost) registerHostFamilies(book, registers);
  registerHealthFamilies(book, registers);
  return registry;
}

type Registers = Registry<RegistryContentType>[];

/** A label-less family read at each scrape; none while `value()` is null (remove() drops the 0 reset() leaves, a lie before data). */
function optional(kind: typeof Counter | typeof Gauge, name: string, help: string, registers: Registers, value: () => number | null): void {
  new kind({
    name,
    help,
    registers,
    collect() {
      this.reset();
      this.remove();
      const v = value();
      if (v === null) return;
      if (this instanceof Gauge) this.set(v);
      else this.inc(v);
    },
  });
}

/** Per host package and RAPL domain: the package's own totals, then each other domain's. */
function packageCounter(
  name: string,
  help: string,
  registers: Registers,
  pkgs: Map<number, RunningTotal>,
  others: Map<string, Map<number, RunningTotal>>,
): void {
  new Counter({
    name,
    help,
    labelNames: ['package', 'domain'],
    registers,
    collect() {
      this.reset();
      for (const [pkg, t] of pkgs) this.inc({ package: String(pkg), domain: 'package' }, ujToJoules(t.total));
      for (const [domain, byPkg] of others) for (const [pkg, t] of byPkg) this.inc({ package: String(pkg), domain }, ujToJoules(t.total));
    },
  });
}

function registerHostFamilies(book: EnergyBook, registers: Registers): void {
  packageCounter(
    METRIC.packageEnergy,
    'The host package\'s RAPL energy in joules per RAPL domain (domain="package": the package\'s own counter), as the helper measured it, accumulated by the exporter',
    registers,
    book.packages,
    book.domainPackages,
  );
  packageCounter(
    METRIC.packageUnattributedEnergy,
    "The part of the host package's energy the helper attributed to no VM (host processes, idle time), in joules per RAPL domain; per package and domain, with the energy of the VMs that ran on it, it sums to the package's energy",
    registers,
    book.packageUnattributed,
    book.domainPackageUnattributed,
  );
  new Counter({
    name: METRIC.unattributedEnergy,
    help: "Energy of all host packages the helper attributed to no VM (host processes, idle time), in joules per RAPL domain; with every VM's energy it sums to the packages' energy",
    labelNames: ['domain'],
    registers,
    collect() {
      this.reset();
      if (!book.hasHost) return;
      this.inc({ domain: 'package' }, ujToJoules(book.unattributed.total));
      for (const [domain, t] of book.domainUnattributed) this.inc({ domain }, ujToJoules(t.total));
    },
  });
}

/** The helper's health and the exporter's own, in the order they are exposed. */
function registerHealthFamilies(book: EnergyBook, registers: Registers): void {
  registerHelperFamilies(book, registers);
  optional(Gauge, METRIC.up, 'Whether the exporter is connected to the helper daemon (1) or reconnecting (0)', registers, () =>
    book.health.connected ? 1 : 0,
  );
  optional(
    Counter,
    METRIC.connects,
    'Connections the exporter made to the helper daemon (more than 1: the daemon restarted or the connection broke)',
    registers,
    () => book.health.connects,
  );
  // Absent, never a guess, when the daemon's host statistics file does not state it.
  new Gauge({
    name: METRIC.energySource,
    help: "Where the helper daemon's energy comes from: msr, powercap, or synthetic (not a measurement)",
    labelNames: ['source'],
    registers,
    collect() {
      this.reset();
      if (book.energySource !== null) this.set({ source: book.energySource }, 1);
    },
  });
  addCapacityFamilies(registers, () => book.capacity);
  optional(
    Gauge,
    METRIC.vmsSkipped,
    'VMs the last LIST named that the exporter does not expose (over --max-vms, or a label set already in use)',
    registers,
    () => book.health.vmsSkipped,
  );
}

/** What the helper reports in its host updates: legacy requests, samples, VMs, connections, the last sample. */
function registerHelperFamilies(book: EnergyBook, registers: Registers): void {
  const h = book.health;
  const counted = (t: RunningTotal) => (book.hasHost ? Number(t.total) : null);
  new Counter({
    name: METRIC.legacyRequests,
    help: "QEMU's legacy MSR requests the helper answered, by result (ok, refused, failed)",
    labelNames: ['result'],
    registers,
    collect() {
      this.reset();
      if (!book.hasHost) return;
      for (const result of ['ok', 'refused', 'failed'] as const) this.inc({ result }, Number(h.legacy[result].total));
    },
  });
  optional(Counter, METRIC.samples, 'Samples the helper took (energy and every vCPU thread run time), as it counts them', registers, () =>
    counted(h.samples),
  );
  optional(Counter, METRIC.sampleFailures, 'Samples that failed because the energy source could not be read', registers, () =>
    counted(h.sampleFailures),
  );
  optional(
    Gauge,
    METRIC.daemonVms,
    'VMs the helper knows (registered and discovered, ended ones not yet dropped), whether or not this exporter may see them',
    registers,
    () => h.daemonVms,
  );
  optional(
    Gauge,
    METRIC.daemonConnections,
    "Connections open to the helper daemon (QEMU's and v2 clients, this exporter included)",
    registers,
    () => h.daemonConnections,
  );
  optional(
    Gauge,
    METRIC.sampleDuration,
    "Time the helper's last sample took (energy and every vCPU thread's run time), in seconds",
    registers,
    () => h.lastSampleDurationS,
  );
  optional(
    Gauge,
    METRIC.lastSampleAge,
    "Age of the helper's last sample in seconds, on the host's monotonic clock (grows while the helper is away or stalled)",
    registers,
    () => book.lastSampleAgeS(),
  );
}

/** The format an Accept header asks for: OpenMetrics when listed with a non-zero q (Prometheus does), else the Prometheus text format. */
export function negotiateFormat(accept: string | undefined): ExpositionFormat {
  if (!accept) return 'prometheus';
  for (const part of accept.split(',')) {
    const [type, ...params] = part
      .trim()
      .split(';')
      .map((s) => s.trim());
    if (type?.toLowerCase() !== 'application/openmetrics-text') continue;
    const q = params.find((p) => p.toLowerCase().startsWith('q='));
    if (q === undefined || Number(q.slice(2)) > 0) return 'openmetrics';
  }
  return 'prometheus';
}
