/** Energy from powercap zones, hosts without `msr`: each energy_uj opened once (root only, CVE-2020-8694), pread at 0 after the drop. */
import fs from 'node:fs';
import { cannot } from '../common/errors.js';
import { errnoName } from '../os/libc/errno.js';
import { closeFd, pread } from '../os/libc/fds.js';
import type { DomainCounter, HostCpu, Vendor } from '../model/host.js';
import { CounterUnwrapper } from './counter-unwrapper.js';
import {
  describeRead,
  ENERGY_DOMAINS,
  EnergyReadError,
  readEach,
  PLATFORM_DOMAINS,
  type EnergyDomain,
  type EnergyReading,
  type EnergySource,
} from './energy-source.js';
import { POWERCAP_CLASS_DIR, scanPowercap, type PowercapZone } from './powercap-zones.js';

export const POWERCAP_UNIT_J = 1e-6;

/** What to do when the powercap RAPL driver is missing (auto's and the errors' fix). */
export const POWERCAP_FIX = "load the powercap RAPL driver with 'modprobe intel_rapl_msr' (Intel and AMD Zen)";

export interface PowercapSourceOptions {
  sysRoot: string;
  /** The host's CPUs: every package of theirs needs a package-N zone. */
  cpus: readonly HostCpu[];
  vendor: Vendor;
  /** The domains to read (--domains); the package is always read. Absent: every domain found. */
  domains?: readonly EnergyDomain[];
  /** Opens an energy_uj file read-only, returning its fd (the daemon's: one opened before its privilege drop). */
  open?: (file: string) => number;
}

/** A domain of a package (or the platform): its zone, or one per die whose sum mod their shared range wraps as one zone's. */
interface OpenZone {
  pkg: number;
  domain: EnergyDomain;
  /** The zone ids, joined with '+' for several dies. */
  id: string;
  parts: { energyPath: string; fd: number }[];
  /** The counter's range: energy_uj takes the values 0..max_energy_range_uj. */
  range: bigint;
}

/** Bytes of an energy_uj read: a u64 in decimal and a newline fit. */
const READ_BYTES = 32;
const DIGIT_0 = 0x30;
const DIGIT_9 = 0x39;

/** What String.prototype.trim() takes away, of the bytes a sysfs file may hold (space, \t, \n, \v, \f, \r). */
function isSpace(c: number): boolean {
  return c === 0x20 || (c >= 0x09 && c <= 0x0d);
}

export class PowercapEnergySource implements EnergySource {
  readonly kind = 'powercap';
  readonly packages: number[];
  readonly domains: readonly EnergyDomain[];
  readonly domainCounters: readonly DomainCounter[];
  /** Zones not read and domains not found, and why. */
  readonly absent: { domain: string; why: string }[] = [];
  private readonly zones: OpenZone[] = [];
  private readonly unwrap = new CounterUnwrapper();
  private readonly buf = Buffer.alloc(READ_BYTES);
  private readonly dir: string;

  /** Throws an EnergyReadError when a package zone cannot be listed or opened, an Error when a domain `domains` asks for is absent. */
  constructor(o: PowercapSourceOptions) {
    this.dir = `${o.sysRoot}/${POWERCAP_CLASS_DIR}`;
    this.packages = [...new Set(o.cpus.map((c) => c.pkg))].sort((a, b) => a - b);
    let scan;
    try {
      scan = scanPowercap(o.sysRoot, o.vendor);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code ?? String(e);
      throw new EnergyReadError(cannot(`list the powercap zones in ${this.dir}`, code, POWERCAP_FIX), this.kind, { cause: e });
    }
    for (const s of scan.skipped) this.absent.push({ domain: s.id, why: s.why });
    const open = o.open ?? ((file: string) => fs.openSync(file, fs.constants.O_RDONLY));
    try {
      for (const pkg of this.packages) {
        for (const domain of ENERGY_DOMAINS) {
          if (PLATFORM_DOMAINS.has(domain) && pkg !== this.packages[0]) continue;
          const zones = scan.zones.filter((z) => z.domain === domain && z.pkg === (PLATFORM_DOMAINS.has(domain) ? undefined : pkg));
          this.add(o, zones, pkg, domain, open);
        }
      }
    } catch (e) {
      this.close();
      throw e;
    }
    const found = new Set(this.zones.map((z) => z.domain));
    this.domains = ENERGY_DOMAINS.filter((d) => found.has(d));
    this.domainCounters = this.zones.flatMap((z) =>
      z.domain === 'package' ? [] : [{ pkg: z.pkg, domain: z.domain, range: z.range, unitJ: POWERCAP_UNIT_J }],
    );
  }

  /** Opens the zone (or the dies' zones) of the package (or platform) for `domain`, or notes why it is not read. */
  private add(o: PowercapSourceOptions, zones: PowercapZone[], pkg: number, domain: EnergyDomain, open: (file: string) => number): void {
    const where = PLATFORM_DOMAINS.has(domain) ? 'the platform' : `package ${pkg}`;
    if (domain !== 'package' && o.domains !== undefined && !o.domains.includes(domain)) {
      if (pkg === this.packages[0]) this.absent.push({ domain, why: 'not in --domains' });
      return;
    }
    let why: string | undefined;
    const parts: OpenZone['parts'] = [];
    if (zones.length === 0) why = `no ${domain === 'package' ? `package-${pkg}` : domain} zone for ${where} in ${this.dir}`;
    else if (zones.some((z) => z.maxEnergyRangeUj !== zones[0]!.maxEnergyRangeUj))
      why = `its dies' zones (${zones.map((z) => z.id).join(', ')}) wrap at different max_energy_range_uj`;
    for (const z of why === undefined ? zones : []) {
      try {
        parts.push({ energyPath: z.energyPath, fd: open(z.energyPath) });
      } catch (e) {
        why = cannot(`open ${z.energyPath}`, (e as NodeJS.ErrnoException).code ?? String(e));
        break;
      }
    }
    if (why === undefined) {
      this.zones.push({ pkg, domain, id: zones.map((z) => z.id).join('+'), parts, range: zones[0]!.maxEnergyRangeUj + 1n });
      return;
    }
    for (const p of parts) closeFd(p.fd);
    const fix = domain === 'package' ? `${POWERCAP_FIX}; energy_uj is readable by root only` : `leave ${domain} out of --domains`;
    if (domain === 'package') throw new EnergyReadError(cannot(`read ${where}'s energy from powercap`, why, fix), this.kind);
    if (o.domains?.includes(domain)) throw new Error(cannot(`read the ${domain} domain of ${where}`, why, fix));
    this.absent.push({ domain, why });
  }

  read(): EnergyReading[] {
    return readEach(this.kind, this.zones, (z) => {
      const counter = { raw: this.readZone(z), range: z.range, unitJ: POWERCAP_UNIT_J };
      return { pkg: z.pkg, domain: z.domain, energyUj: this.unwrap.energyUj(z.id, counter), counter };
    });
  }

  /** The zone's counter now: its energy_uj, or its dies' summed mod the range (OpenZone). */
  private readZone(z: OpenZone): bigint {
    let sum = 0n;
    for (const p of z.parts) sum += this.readPart(p) % z.range;
    return z.parts.length === 1 ? sum : sum % z.range;
  }

  /** energy_uj now (1 to 20 digits, white space around), parsed from the bytes read: no string per read; past 2^53 as text. */
  private readPart(z: { energyPath: string; fd: number }): bigint {
    const n = pread(z.fd, this.buf, READ_BYTES, 0);
    if (n < 0) throw new Error(cannot(`read ${z.energyPath}`, errnoName(-n)));
    const b = this.buf;
    let i = 0;
    while (i < n && isSpace(b[i]!)) i++;
    const first = i;
    let value = 0;
    while (i < n && b[i]! >= DIGIT_0 && b[i]! <= DIGIT_9) value = value * 10 + (b[i++]! - DIGIT_0);
    const digits = i - first;
    while (i < n && isSpace(b[i]!)) i++;
    const text = () => b.toString('latin1', 0, n).trim();
    if (digits === 0 || digits > 20 || i !== n)
      throw new Error(cannot(`read ${z.energyPath}`, `${JSON.stringify(text())} is not a count of µJ`));
    return Number.isSafeInteger(value) ? BigInt(value) : BigInt(text());
  }

  describe(): string {
    const idsOf = (d: EnergyDomain) => this.zones.filter((z) => z.domain === d).map((z) => z.id);
    return describeRead(
      `powercap (${this.dir}, µJ)`,
      this.domains.map((d) => `${d} (${idsOf(d).join(', ')})`),
      this.absent,
    );
  }

  /** Closes the energy_uj fds: the source owns them, also those opened for it before a privilege drop. */
  close(): void {
    for (const z of this.zones.splice(0)) for (const p of z.parts) closeFd(p.fd);
  }
}
