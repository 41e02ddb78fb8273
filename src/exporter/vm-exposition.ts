/**
 * The per-VM metric families, the bulk of a scrape: each VM's label text escaped once and kept with its record (a WeakMap),
 * where prom-client escapes every label set at every scrape. Byte for byte prom-client's text in both formats (tests compare).
 */
import type { EnergyBook, VmLabels, BookedVm } from './energy-book.js';
import { RunningTotal, ujToJoules } from './running-total.js';
import type { EnergyDomain } from '../model/domains.js';

export type ExpositionFormat = 'prometheus' | 'openmetrics';

interface VmFamily {
  name: string;
  help: string;
  type: 'counter' | 'gauge';
}

/** The per-VM families: labels name, uuid, pid, uid, then vpkg and domain (energy, power) or source, whole_vm_only and sampled_whole (info). */
export const VM_FAMILIES = {
  limit: {
    name: 'vmsr_vm_power_limit_watts',
    help: "The VM's power limit on the attributed power of a RAPL domain (label domain: package, core, uncore, dram, psys), in watts (docs/power-limits.md); 0 once removed; only VMs and domains that had one",
    type: 'gauge',
  },
  limited: {
    name: 'vmsr_vm_power_limited_seconds_total',
    help: "Time the helper's CPU quota held the VM to its power limit, in seconds, accumulated by the exporter; only VMs that had a limit",
    type: 'counter',
  },
  guest: {
    name: 'vmsr_vm_guest_energy_joules_total',
    help: 'With the helper\'s --guest-energy exact: energy QEMU was given to credit the VM\'s guest (of="guest", what its MSR_PKG_ENERGY_STATUS grew by), the energy the helper attributed to the VM over the same windows (of="exact"), and the energy QEMU\'s arithmetic credited otherwise than it would have without garbage (of="garbage"), in joules; only VMs in exact mode',
    type: 'counter',
  },
  garbage: {
    name: 'vmsr_vm_guest_garbage_windows_total',
    help: "With the helper's --guest-energy exact: windows in which QEMU's arithmetic turned the VM's delta into garbage (a thread it listed exited after the reply): the guest's counter is off; only VMs in exact mode",
    type: 'counter',
  },
  energy: {
    name: 'vmsr_vm_energy_joules_total',
    help: 'Energy attributed to the VM\'s virtual package per RAPL domain (domain="package": the package\'s), in joules, accumulated by the exporter (never decreases within a series)',
    type: 'counter',
  },
  power: {
    name: 'vmsr_vm_power_watts',
    help: "Power of the VM's virtual package per RAPL domain over the helper's last sampling interval, in watts (absent until two samples, and once the VM ended)",
    type: 'gauge',
  },
  info: {
    name: 'vmsr_vm_info',
    help: 'One per VM the exporter observes: its name, UUID, pid, owner uid, whether discovered or registered, and whether its vCPUs could be told apart (whole_vm_only="1": one virtual package for the whole VM), and whether every thread of it is sampled (sampled_whole="0": over its share of the helper\'s fds, its energy is a lower bound)',
    type: 'gauge',
  },
} satisfies Record<string, VmFamily>;

/** Escaping of the exposition formats: HELP text (backslash, newline) and label values (also the double quote). */
function escapeHelp(s: string): string {
  return s.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
}

function escapeLabelValue(s: string): string {
  return escapeHelp(s).replace(/"/g, '\\"');
}

/** A sample value as the formats write it (prom-client's rules: +Inf, -Inf, and its spelling of NaN). */
function formatValue(v: number): string {
  if (Number.isNaN(v)) return 'Nan';
  if (!Number.isFinite(v)) return v < 0 ? '-Inf' : '+Inf';
  return `${v}`;
}

/** The label text of one VM, escaped once: `name="..",uuid="..",pid="..",uid=".."`, then per vpkg and for info. */
interface VmText {
  base: string;
  /** `{base,vpkg="g",domain="d"} ` per RAPL domain and virtual package. */
  vpkg: Map<EnergyDomain, string[]>;
  /** `{base,source="..",whole_vm_only="..",sampled_whole=".."} ` and what it was made from. */
  info: string;
  infoOf: string;
}

function baseText(l: VmLabels): string {
  return `name="${escapeLabelValue(l.name)}",uuid="${escapeLabelValue(l.uuid)}",pid="${escapeLabelValue(l.pid)}",uid="${escapeLabelValue(l.uid)}"`;
}

export class VmExposition {
  private readonly text = new WeakMap<BookedVm, VmText>();

  constructor(private readonly book: EnergyBook) {}

  /** The per-VM families as prom-client writes them in `format`, without the separator after them (Prometheus: a blank line). */
  render(format: ExpositionFormat): string {
    const vms = this.book.exposed();
    const { energy, power, info, guest, garbage, limit, limited: time } = VM_FAMILIES;
    const out: string[] = [];
    const head = (f: VmFamily) => {
      // OpenMetrics names a counter's family without _total and its samples with it.
      const family = format === 'openmetrics' && f.type === 'counter' ? f.name.replace(/_total$/, '') : f.name;
      out.push(`# HELP ${family} ${escapeHelp(f.help)}\n# TYPE ${family} ${f.type}`);
      return format === 'openmetrics' && f.type === 'counter' ? `${family}_total` : f.name;
    };
    const sep = format === 'openmetrics' ? '\n' : '\n\n';
    // Per VM, the package's series, then each other domain's (the order the helper's files give them).
    type Values = readonly (RunningTotal | number | null)[];
    const vpkgFamily = (f: VmFamily, of: (r: BookedVm) => [Values, Map<EnergyDomain, Values>]) => {
      const name = head(f);
      const series = (t: VmText, domain: EnergyDomain, xs: Values) => {
        for (let g = 0; g < xs.length; g++) {
          const x = xs[g];
          const v = x instanceof RunningTotal ? ujToJoules(x.total) : x;
          if (v !== null && v !== undefined) out.push(`\n${name}${this.vpkgText(t, domain, g)}${formatValue(v)}`);
        }
      };
      for (const r of vms) {
        const t = this.textOf(r);
        const [own, others] = of(r);
        series(t, 'package', own);
        for (const [domain, xs] of others) series(t, domain, xs);
      }
      out.push(sep);
    };
    vpkgFamily(energy, (r) => [r.energy, r.domainEnergy]);
    vpkgFamily(power, (r) => [r.watts, r.domainWatts]);
    // Only VMs in exact mode, or that had a power limit: a helper that gives none gives no empty family.
    const family = (f: VmFamily, rows: readonly BookedVm[], series: (r: BookedVm) => [labels: string, value: number][]) => {
      if (rows.length === 0) return;
      const name = head(f);
      for (const r of rows) for (const [labels, v] of series(r)) out.push(`\n${name}{${this.textOf(r).base}${labels}} ${formatValue(v)}`);
      out.push(sep);
    };
    const exact = vms.filter((r) => r.guest !== null);
    family(guest, exact, (r) => (['guest', 'exact', 'garbage'] as const).map((of) => [`,of="${of}"`, ujToJoules(r.guest![of].total)]));
    family(garbage, exact, (r) => [['', Number(r.guest!.garbageWindows.total)]]);
    const limited = vms.filter((r) => r.limit !== null);
    family(limit, limited, (r) => [...r.limit!.watts].map(([d, w]) => [`,domain="${d}"`, w]));
    family(time, limited, (r) => [['', Number(r.limit!.limitedMs.total) / 1000]]);
    const infoName = head(info);
    for (const r of vms) out.push(`\n${infoName}${this.infoText(r)}1`);
    return out.join('');
  }

  private textOf(r: BookedVm): VmText {
    let t = this.text.get(r);
    if (!t) this.text.set(r, (t = { base: baseText(r.labels), vpkg: new Map(), info: '', infoOf: '' }));
    return t;
  }

  private vpkgText(t: VmText, domain: EnergyDomain, g: number): string {
    let texts = t.vpkg.get(domain);
    if (!texts) t.vpkg.set(domain, (texts = []));
    return (texts[g] ??= `{${t.base},vpkg="${g}",domain="${domain}"} `);
  }

  /** Remade when source, whole_vm_only or sampled_whole change (a registrant takes over a discovered VM, a process outgrows its share). */
  private infoText(r: BookedVm): string {
    const t = this.textOf(r);
    const whole = r.notWhole ? '0' : '1';
    const of = `${r.source}\u0000${r.wholeVmOnly ? '1' : '0'}\u0000${whole}`;
    if (t.infoOf !== of) {
      t.info = `{${t.base},source="${escapeLabelValue(r.source)}",whole_vm_only="${r.wholeVmOnly ? '1' : '0'}",sampled_whole="${whole}"} `;
      t.infoOf = of;
    }
    return t.info;
  }
}
