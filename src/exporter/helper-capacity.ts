/** The helper's VM caps and fd budget, as its host statistics file states them (docs/stats-fd.md "The host's file"); absent, never a guess. */
import { Gauge, type Registry, type RegistryContentType } from 'prom-client';
import type { StatsReader, StatsSample } from '../client/stats-reader.js';

export const CAPACITY_METRIC = {
  vmCap: 'vmsr_helper_vm_cap',
  vmCapUsed: 'vmsr_helper_vm_cap_used',
  openFds: 'vmsr_helper_open_fds',
  maxFds: 'vmsr_helper_max_fds',
  fdsAvailable: 'vmsr_helper_fds_available',
} as const;

/** The `cap` label: which of the daemon's VM caps, and the host file's names of its two values. */
const CAPS = [
  { cap: 'registration', used: 'vms_registered', max: 'vms_registered_max' },
  { cap: 'discovery', used: 'vms_discovered', max: 'vms_discovered_max' },
] as const;

export interface HelperCapacity {
  caps: { cap: (typeof CAPS)[number]['cap']; used: number; max: number }[];
  fds: { open: number; max: number; available: number } | null;
}

/** The capacity in one sample of the host's file; a cap or budget the file lacks a value of is left out. */
export function capacityFromFile(r: StatsReader, s: StatsSample): HelperCapacity {
  const num = (name: string): number | null => {
    const v = r.value(s, name);
    return v === undefined ? null : Number(v);
  };
  const caps = CAPS.flatMap(({ cap, ...names }) => {
    const [used, max] = [num(names.used), num(names.max)];
    return used !== null && max !== null ? [{ cap, used, max }] : [];
  });
  const open = num('fds_open');
  const max = num('fds_max');
  const available = num('fds_available');
  return { caps, fds: open !== null && max !== null && available !== null ? { open, max, available } : null };
}

/** Adds the families to `registers`; `capacity()` is read at each scrape (null: nothing stated). */
export function addCapacityFamilies(registers: Registry<RegistryContentType>[], capacity: () => HelperCapacity | null): void {
  const gauge = (name: string, help: string, value: (c: HelperCapacity) => { labels?: { cap: string }; v: number }[]): void => {
    const labelled = name === CAPACITY_METRIC.vmCap || name === CAPACITY_METRIC.vmCapUsed;
    new Gauge({
      name,
      help,
      labelNames: labelled ? ['cap'] : [],
      registers,
      collect() {
        this.reset();
        // reset() leaves a label-less gauge at 0, a value nobody stated: remove() drops it.
        if (!labelled) this.remove();
        const c = capacity();
        if (c === null) return;
        for (const { labels, v } of value(c)) {
          if (labels) this.set(labels, v);
          else this.set(v);
        }
      },
    });
  };
  gauge(
    CAPACITY_METRIC.vmCap,
    'The most VMs the helper takes, per cap: registration (its --max-vms) and discovery (its --max-discovered-vms); past it a REGISTER is refused, a discovered VM is not tracked',
    (c) => c.caps.map((k) => ({ labels: { cap: k.cap }, v: k.max })),
  );
  gauge(CAPACITY_METRIC.vmCapUsed, "VMs counted against each of the helper's VM caps (see vmsr_helper_vm_cap)", (c) =>
    c.caps.map((k) => ({ labels: { cap: k.cap }, v: k.used })),
  );
  gauge(CAPACITY_METRIC.openFds, 'File descriptors open in the helper daemon', (c) => (c.fds ? [{ v: c.fds.open }] : []));
  gauge(CAPACITY_METRIC.maxFds, "The helper daemon's open-file limit (its soft RLIMIT_NOFILE)", (c) => (c.fds ? [{ v: c.fds.max }] : []));
  gauge(
    CAPACITY_METRIC.fdsAvailable,
    'File descriptors a new VM or statistics file may still take in the helper: its limit minus the fds open, the slots kept for connections not yet made and a reserve; a VM whose threads need more is not admitted',
    (c) => (c.fds ? [{ v: c.fds.available }] : []),
  );
}
