/**
 * The per-VM families rendered from cached label text must be exactly what prom-client renders for
 * the same values, in both formats: prom-client is the reference for escaping, number formatting,
 * HELP/TYPE lines and OpenMetrics' counter naming. Hostile names (quotes, backslashes, newlines,
 * non-ASCII) included, and the cache follows a VM whose source or virtual packages change.
 */
import { Counter, Gauge, Registry, type RegistryContentType } from 'prom-client';
import { describe, expect, test } from 'vitest';
import { EnergyBook } from '../../src/exporter/energy-book.js';
import { ujToJoules } from '../../src/exporter/running-total.js';
import { VM_FAMILIES, VmExposition, type ExpositionFormat } from '../../src/exporter/vm-exposition.js';
import type { VmInfo } from '../../src/client/v2-replies.js';

/** The three families through prom-client's own Counter and Gauge, as the exporter once built them. */
async function reference(book: EnergyBook, format: ExpositionFormat): Promise<string> {
  const registry = new Registry<RegistryContentType>();
  registry.setContentType(format === 'openmetrics' ? Registry.OPENMETRICS_CONTENT_TYPE : Registry.PROMETHEUS_CONTENT_TYPE);
  const registers = [registry];
  const vmLabels = ['name', 'uuid', 'pid', 'uid'] as const;
  const energy = new Counter({
    name: VM_FAMILIES.energy.name,
    help: VM_FAMILIES.energy.help,
    labelNames: [...vmLabels, 'vpkg', 'domain'],
    registers,
  });
  const power = new Gauge({
    name: VM_FAMILIES.power.name,
    help: VM_FAMILIES.power.help,
    labelNames: [...vmLabels, 'vpkg', 'domain'],
    registers,
  });
  // Only when a VM is in exact mode (--guest-energy exact): between power and info.
  const exact = book.exposed().filter((r) => r.guest !== null);
  const guest =
    exact.length > 0
      ? new Counter({ name: VM_FAMILIES.guest.name, help: VM_FAMILIES.guest.help, labelNames: [...vmLabels, 'of'], registers })
      : null;
  const garbage =
    exact.length > 0
      ? new Counter({ name: VM_FAMILIES.garbage.name, help: VM_FAMILIES.garbage.help, labelNames: [...vmLabels], registers })
      : null;
  for (const r of exact) {
    guest!.inc({ ...r.labels, of: 'guest' }, ujToJoules(r.guest!.guest.total));
    guest!.inc({ ...r.labels, of: 'exact' }, ujToJoules(r.guest!.exact.total));
    guest!.inc({ ...r.labels, of: 'garbage' }, ujToJoules(r.guest!.garbage.total));
    garbage!.inc({ ...r.labels }, Number(r.guest!.garbageWindows.total));
  }
  // Only for VMs that had a power limit: after the guest energy, before info.
  const limited = book.exposed().filter((r) => r.limit !== null);
  if (limited.length > 0) {
    const limit = new Gauge({ name: VM_FAMILIES.limit.name, help: VM_FAMILIES.limit.help, labelNames: [...vmLabels, 'domain'], registers });
    const time = new Counter({ name: VM_FAMILIES.limited.name, help: VM_FAMILIES.limited.help, labelNames: vmLabels, registers });
    for (const r of limited) for (const [domain, w] of r.limit!.watts) limit.set({ ...r.labels, domain }, w);
    for (const r of limited) time.inc(r.labels, Number(r.limit!.limitedMs.total) / 1000);
  }
  const info = new Gauge({
    name: VM_FAMILIES.info.name,
    help: VM_FAMILIES.info.help,
    labelNames: [...vmLabels, 'source', 'whole_vm_only', 'sampled_whole'],
    registers,
  });
  for (const r of book.exposed()) {
    r.energy.forEach((t, g) => energy.inc({ ...r.labels, vpkg: String(g), domain: 'package' }, ujToJoules(t.total)));
    for (const [domain, totals] of r.domainEnergy)
      totals.forEach((t, g) => energy.inc({ ...r.labels, vpkg: String(g), domain }, ujToJoules(t.total)));
  }
  for (const r of book.exposed()) {
    const watts: [string, (number | null)[]][] = [['package', r.watts], ...r.domainWatts];
    for (const [domain, ws] of watts)
      ws.forEach((w, g) => {
        if (w !== null) power.set({ ...r.labels, vpkg: String(g), domain }, w);
      });
  }
  for (const r of book.exposed()) {
    info.set({ ...r.labels, source: r.source, whole_vm_only: r.wholeVmOnly ? '1' : '0', sampled_whole: r.notWhole ? '0' : '1' }, 1);
  }
  return registry.metrics();
}

/** Ours, completed the way prom-client ends a body. */
function ours(x: VmExposition, format: ExpositionFormat): string {
  return `${x.render(format)}${format === 'openmetrics' ? '\n# EOF\n' : '\n'}`;
}

const vm = (id: number, o: Partial<VmInfo> = {}): VmInfo => ({
  hostVmId: id,
  pid: 4000 + id,
  uid: 0,
  starttime: BigInt(id),
  name: `vm-${id}`,
  uuid: null,
  source: 'discovered',
  nvpkg: 2,
  ended: false,
  wholeVmOnly: false,
  ...o,
});
const upd = (id: number, s: number, uj: bigint[]) => ({
  hostVmId: id,
  tNs: BigInt(s) * 1_000_000_000n,
  ended: false,
  vpkgs: uj.map((energyUj) => ({ counter: 0n, energyUj })),
});

function hostileBook(): EnergyBook {
  const b = new EnergyBook();
  b.connectionStarted();
  b.listed([
    vm(1, { name: 'web "1" \\ back\nslash', uuid: '6f1c1a7e-0000-4000-8000-000000000001' }),
    vm(2, { name: 'ünïcode ☃ {braces}=,', source: 'registered', wholeVmOnly: true, nvpkg: 1 }),
    vm(3, { name: null }),
  ]);
  b.vmUpdate(upd(1, 1, [1_000_000n, 0n]));
  b.vmUpdate(upd(1, 2, [3_500_001n, 250_000n]));
  b.vmUpdate(upd(2, 1, [123_456_789_012n]));
  b.vmUpdate(upd(3, 1, [1n, 2n]));
  b.vmUpdate(upd(3, 3, [7n, 1_000_000_000_000_000n]), undefined, [
    { domain: 'core', energyUj: [5n, 1_500_000n], powerW: [0.25, 1e-7] },
    { domain: 'dram', energyUj: [3n, 4n], powerW: [2, 3] },
  ]);
  return b;
}

describe('per-VM families rendered from cached label text', () => {
  test('are byte for byte what prom-client renders, in both formats, hostile names included', async () => {
    const book = hostileBook();
    const x = new VmExposition(book);
    for (const format of ['prometheus', 'openmetrics'] as const) {
      const want = await reference(book, format);
      expect(ours(x, format)).toBe(want);
      // The second render comes from the cache and is still the same.
      expect(ours(x, format)).toBe(want);
    }
    expect(ours(x, 'prometheus')).toContain(
      'vmsr_vm_energy_joules_total{name="web \\"1\\" \\\\ back\\nslash",uuid="6f1c1a7e-0000-4000-8000-000000000001",pid="4001",uid="0",vpkg="0",domain="package"} 3.500001\n',
    );
    expect(ours(x, 'prometheus')).toContain('vmsr_vm_energy_joules_total{name="",uuid="",pid="4003",uid="0",vpkg="1",domain="core"} 1.5\n');
    expect(ours(x, 'prometheus')).toContain('vmsr_vm_power_watts{name="",uuid="",pid="4003",uid="0",vpkg="0",domain="dram"} 2\n');
  });

  test("an empty book still has each family's HELP and TYPE lines, as prom-client writes them", async () => {
    const book = new EnergyBook();
    const x = new VmExposition(book);
    for (const format of ['prometheus', 'openmetrics'] as const) expect(ours(x, format)).toBe(await reference(book, format));
  });

  test('follows a VM that a registration takes over (source, fewer virtual packages) and one that ends', async () => {
    const book = hostileBook();
    const x = new VmExposition(book);
    x.render('prometheus'); // fills the cache
    book.listed([
      vm(1, { name: 'web "1" \\ back\nslash', uuid: '6f1c1a7e-0000-4000-8000-000000000001', source: 'registered', nvpkg: 1 }),
      vm(2, { name: 'ünïcode ☃ {braces}=,', source: 'registered', wholeVmOnly: true, nvpkg: 1 }),
    ]);
    book.vmUpdate(upd(1, 3, [4_000_000n]));
    for (const format of ['prometheus', 'openmetrics'] as const) expect(ours(x, format)).toBe(await reference(book, format));
    expect(x.render('prometheus')).toMatch(/vmsr_vm_info\{name="web[^}]*source="registered",whole_vm_only="0",sampled_whole="1"\} 1/);
    expect(x.render('prometheus')).not.toMatch(/pid="4001",uid="0",vpkg="1"/);
    // VM 3 ended (the LIST no longer names it): its domains' power goes with its package's, their energy stays.
    expect(x.render('prometheus')).not.toMatch(/vmsr_vm_power_watts\{[^}]*pid="4003"/);
    expect(x.render('prometheus')).toMatch(/vmsr_vm_energy_joules_total\{[^}]*pid="4003",uid="0",vpkg="1",domain="dram"\} 0.000004/);
  });

  test('has the guest energy family, only for VMs in exact mode, as prom-client renders it', async () => {
    const book = hostileBook();
    const garbage = { garbageWindows: 3n, garbageUj: 1_250_000n };
    book.vmUpdate(upd(1, 4, [5_000_000n, 250_000n]), undefined, [], { guestUj: 4_990_000n, exactUj: 5_000_000n, ...garbage });
    const x = new VmExposition(book);
    for (const format of ['prometheus', 'openmetrics'] as const) expect(ours(x, format)).toBe(await reference(book, format));
    expect(ours(x, 'prometheus')).toMatch(/vmsr_vm_guest_energy_joules_total\{[^}]*pid="4001",uid="0",of="guest"\} 4.99\n/);
    expect(ours(x, 'prometheus')).toMatch(/vmsr_vm_guest_energy_joules_total\{[^}]*pid="4001",uid="0",of="exact"\} 5\n/);
    expect(ours(x, 'prometheus')).toMatch(/vmsr_vm_guest_energy_joules_total\{[^}]*pid="4001",uid="0",of="garbage"\} 1.25\n/);
    expect(ours(x, 'prometheus')).toMatch(/vmsr_vm_guest_garbage_windows_total\{[^}]*pid="4001",uid="0"\} 3\n/);
    expect(ours(x, 'prometheus')).not.toMatch(/vmsr_vm_guest_energy_joules_total\{[^}]*pid="4002"/);
  });

  test('has the power limit families with each limited domain, only for VMs and domains that had a limit, as prom-client renders them', async () => {
    const book = hostileBook();
    const limits = (pkg: bigint, dram: bigint) => new Map([['package', pkg] as const, ['dram', dram] as const]);
    book.vmUpdate(upd(1, 4, [5_000_000n, 250_000n]), undefined, [], undefined, { limitsMw: limits(35_500n, 4_000n), limitedMs: 12_250n });
    book.vmUpdate(upd(2, 4, [1_000_000n]), undefined, [], undefined, { limitsMw: limits(0n, 0n), limitedMs: 0n });
    book.vmUpdate(upd(3, 4, [1_000_000n]), undefined, [], undefined, { limitsMw: limits(0n, 2_500n), limitedMs: 0n });
    const x = new VmExposition(book);
    for (const format of ['prometheus', 'openmetrics'] as const) expect(ours(x, format)).toBe(await reference(book, format));
    expect(ours(x, 'prometheus')).toMatch(/vmsr_vm_power_limit_watts\{[^}]*pid="4001",uid="0",domain="package"\} 35.5\n/);
    expect(ours(x, 'prometheus')).toMatch(/vmsr_vm_power_limit_watts\{[^}]*pid="4001",uid="0",domain="dram"\} 4\n/);
    expect(ours(x, 'prometheus')).toMatch(/vmsr_vm_power_limit_watts\{[^}]*pid="4003",uid="0",domain="dram"\} 2.5\n/);
    expect(ours(x, 'prometheus')).not.toMatch(/vmsr_vm_power_limit_watts\{[^}]*pid="4003",uid="0",domain="package"/);
    expect(ours(x, 'prometheus')).toMatch(/vmsr_vm_power_limited_seconds_total\{[^}]*pid="4001",uid="0"\} 12.25\n/);
    expect(ours(x, 'prometheus')).not.toMatch(/vmsr_vm_power_limit_watts\{[^}]*pid="4002"/);
  });
});
