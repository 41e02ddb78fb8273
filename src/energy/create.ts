/** THE one place an energy source is built, for the daemon and `record`: per kind (kinds.ts), its host facts and how it is made. */
import { readCpuModel, type CpuModel } from '../msr/vendor.js';
import type { MsrDevice } from '../msr/device.js';
import type { HostPaths } from '../msr/host-paths.js';
import { readHostInfo, type ReadHostInfoOptions } from '../msr/host-info.js';
import type { HostInfo } from '../model/host.js';
import type { EnergyDomain, EnergySource } from './energy-source.js';
import type { EnergySourceKind } from './kinds.js';
import { MsrEnergySource } from './msr-source.js';
import { POWERCAP_UNIT_J, PowercapEnergySource } from './powercap-source.js';
import { scanPowercap, type PowercapZone } from './powercap-zones.js';
import { SYNTHETIC_DEFAULTS, SyntheticEnergySource } from './synthetic-source.js';

interface EnergySourceContext {
  /** The host the source reads (readHostInfoFor, same kind). */
  host: Pick<HostInfo, 'vendor' | 'cpus' | 'packages'>;
  paths: HostPaths;
  /** MSR fds: the caller's (shared with the legacy service), opened and closed by it, never by a source. */
  device: MsrDevice;
  /** --domains: the domains to read besides the package; absent, every domain the source finds. */
  domains?: readonly EnergyDomain[];
  /** The CPU's family and model (domain units); absent, read from paths.procRoot's cpuinfo. */
  model?: CpuModel;
  /** Opens a powercap energy_uj file (the daemon: the fd it opened before its privilege drop). */
  openPowercap?: (file: string) => number;
}

interface EnergySourceDefinition {
  /** The power unit of every package of a source that reads no MSR; absent: it reads them (and its errors get msrErrorWithHint). */
  powerUnit?: bigint;
  /** Host info's description of each package's counter, when it is not a RAPL MSR's. */
  describeCounters?(host: HostInfo, paths: HostPaths): void;
  create(c: EnergySourceContext): EnergySource;
}

const SOURCES: { readonly [K in EnergySourceKind]: EnergySourceDefinition } = {
  msr: {
    create: (c) =>
      new MsrEnergySource({
        device: c.device,
        cpus: c.host.cpus,
        vendor: c.host.vendor,
        sysRoot: c.paths.sysRoot,
        model: c.model ?? readCpuModel(c.paths.procRoot),
        ...(c.domains ? { domains: c.domains } : {}),
      }),
  },
  powercap: {
    // The guest-facing unit of its VMs' counters (ESU 14, as the synthetic source's); the package counters are HostPackage.counter.
    powerUnit: SYNTHETIC_DEFAULTS.powerUnit,
    describeCounters: (host, paths) => {
      let zones: PowercapZone[] = [];
      try {
        zones = scanPowercap(paths.sysRoot, host.vendor).zones;
      } catch {
        return; // the source, made next, says why
      }
      for (const p of host.packages) {
        const z = zones.find((x) => x.domain === 'package' && x.pkg === p.pkg);
        if (z) p.counter = { range: z.maxEnergyRangeUj + 1n, unitJ: POWERCAP_UNIT_J };
      }
    },
    create: (c) =>
      new PowercapEnergySource({
        sysRoot: c.paths.sysRoot,
        cpus: c.host.cpus,
        vendor: c.host.vendor,
        ...(c.domains ? { domains: c.domains } : {}),
        ...(c.openPowercap ? { open: c.openPowercap } : {}),
      }),
  },
  synthetic: {
    powerUnit: SYNTHETIC_DEFAULTS.powerUnit,
    create: (c) => new SyntheticEnergySource({ procRoot: c.paths.procRoot, cpus: c.host.cpus, powerUnit: c.host.packages[0]!.powerUnit }),
  },
};

/** Whether a source of this kind reads the RAPL MSRs (its errors then get msrErrorWithHint's fix). */
export function readsMsrs(kind: EnergySourceKind): boolean {
  return SOURCES[kind].powerUnit === undefined;
}

/** The host facts a source of this kind goes with: power units from the MSRs, or the unit it counts in. */
export function readHostInfoFor(kind: EnergySourceKind, o: Omit<ReadHostInfoOptions, 'powerUnit'>): HostInfo {
  const unit = SOURCES[kind].powerUnit;
  const host = readHostInfo(unit === undefined ? o : { ...o, powerUnit: unit });
  SOURCES[kind].describeCounters?.(host, o.paths);
  return host;
}

/** The host facts with the counters of the domains `energy` reads besides the package (what the engine and traces attribute). */
export function withDomainCounters(host: HostInfo, energy: EnergySource): HostInfo {
  return energy.domainCounters.length === 0 ? host : { ...host, domains: energy.domainCounters.map((d) => ({ ...d })) };
}

/** The energy source of this kind for this host. Throws an EnergyReadError when its input cannot be read at all. */
export function createEnergySource(kind: EnergySourceKind, c: EnergySourceContext): EnergySource {
  return SOURCES[kind].create(c);
}
