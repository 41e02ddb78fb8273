/**
 * A host whose RAPL registers are files: this machine has no /dev/cpu/N/msr, so each CPU gets a
 * sparse file read through the real code path (pread at offset = MSR number). sysfs is faked too,
 * so tests choose the topology; /proc stays the real one.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { msrPath } from '../../src/msr/host-paths.js';
import { MSR_PKG_ENERGY_STATUS, MSR_RAPL_POWER_UNIT } from '../../src/msr/registers.js';

export interface FakeHostOptions {
  /** package id of each CPU, index = CPU number; default two CPUs in package 0. */
  packages?: number[];
  /** CPUs listed as online in sysfs; default all. */
  online?: number[];
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
   * Writes only bits 31:0 of a package's energy counter on each of its CPUs (4 bytes at offset =
   * MSR). The upper half is reserved in hardware, and in a sparse file the 8 bytes of one MSR
   * overlap its neighbours (0x611 covers 0x614's low byte), so a running counter stays out of
   * them as long as its top byte does not change.
   */
  writePackageCounter32(pkg: number, msr: number, value: number): void {
    const buf = Buffer.alloc(4);
    buf.writeUInt32LE(value >>> 0);
    this.cpuPackages.forEach((p, cpu) => {
      if (p !== pkg) return;
      const fd = fs.openSync(this.msrPath(cpu), 'r+');
      try {
        // the device always returns 8 bytes: keep the file long enough for a read of this MSR
        if (fs.fstatSync(fd).size < msr + 8) fs.ftruncateSync(fd, msr + 8);
        fs.writeSync(fd, buf, 0, 4, msr);
      } finally {
        fs.closeSync(fd);
      }
    });
  }

  /** Same MSR value on every CPU of a package (package-scope registers). */
  writePackageMsr(pkg: number, msr: number, value: bigint): void {
    this.cpuPackages.forEach((p, cpu) => {
      if (p === pkg) this.writeMsr(cpu, msr, value);
    });
  }

  /**
   * Steady package power: writes `powerUnit` to MSR_RAPL_POWER_UNIT, then adds `units` to package
   * `pkg`'s MSR_PKG_ENERGY_STATUS (32-bit, wrapping from `start`) every `everyMs`. Returns the stop.
   */
  pumpEnergy(o: { pkg?: number; powerUnit?: bigint; start?: number; units: number; everyMs: number }): () => void {
    const pkg = o.pkg ?? 0;
    this.writePackageMsr(pkg, MSR_RAPL_POWER_UNIT, o.powerUnit ?? 0xa0e03n);
    let energy = (o.start ?? 0) >>> 0;
    this.writePackageMsr(pkg, MSR_PKG_ENERGY_STATUS, BigInt(energy));
    const t = setInterval(() => {
      energy = (energy + o.units) >>> 0;
      this.writePackageMsr(pkg, MSR_PKG_ENERGY_STATUS, BigInt(energy));
    }, o.everyMs);
    return () => clearInterval(t);
  }

  cleanup(): void {
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}
