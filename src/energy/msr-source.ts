/** Package energy from the RAPL MSRs: MSR_PKG_ENERGY_STATUS (Intel 0x611, AMD 0xC001029B) of each package. */
import type { MsrDevice } from '../msr/device.js';
import { packageEnergyMsr, powerUnitMsr } from '../msr/registers.js';
import { firstCpuPerPackage } from '../msr/topology.js';
import { joulesPerCounterUnit, RAPL_COUNTER_RANGE } from '../ratio/counter.js';
import type { HostCpu, Vendor } from '../ratio/types.js';
import { CounterUnwrapper } from './counter-unwrapper.js';
import { EnergyReadError, type EnergyDomain, type EnergyReading, type EnergySource } from './energy-source.js';

/**
 * The package energy register of each package, read through its lowest-numbered online CPU. Its unit
 * (the ESU of the package's power unit register) is read once, at the first read that needs it.
 */
export class MsrEnergySource implements EnergySource {
  readonly kind = 'msr';
  readonly packages: number[];
  readonly domains: readonly EnergyDomain[] = ['package'];
  private readonly cpuOf: Map<number, number>;
  private readonly energyMsr: number;
  private readonly unitMsr: number;
  private readonly unitJ = new Map<number, number>();
  private readonly unwrap = new CounterUnwrapper();

  constructor(
    private readonly device: MsrDevice,
    cpus: readonly HostCpu[],
    vendor: Vendor,
  ) {
    this.cpuOf = firstCpuPerPackage(cpus);
    this.packages = [...this.cpuOf.keys()].sort((a, b) => a - b);
    this.energyMsr = packageEnergyMsr(vendor);
    this.unitMsr = powerUnitMsr(vendor);
  }

  /** Throws an EnergyReadError whose message is the MsrReadError's, the MsrReadError as its cause (msrErrorWithHint reads it). */
  read(): EnergyReading[] {
    const raws: [number, bigint, number][] = [];
    try {
      for (const pkg of this.packages) {
        const cpu = this.cpuOf.get(pkg)!;
        let unitJ = this.unitJ.get(pkg);
        if (unitJ === undefined) this.unitJ.set(pkg, (unitJ = joulesPerCounterUnit(this.device.read(cpu, this.unitMsr))));
        raws.push([pkg, this.device.read(cpu, this.energyMsr), unitJ]);
      }
    } catch (e) {
      throw new EnergyReadError(e instanceof Error ? e.message : String(e), this.kind, { cause: e });
    }
    return raws.map(([pkg, raw, unitJ]) => {
      const counter = { raw, range: RAPL_COUNTER_RANGE, unitJ };
      return { package: pkg, domain: 'package', energyUj: this.unwrap.energyUj(`package ${pkg}`, counter), counter };
    });
  }

  describe(): string {
    return 'energy counters read from RAPL MSRs';
  }

  /** The device belongs to the caller (it is shared with the legacy server); nothing to close here. */
  close(): void {}
}
