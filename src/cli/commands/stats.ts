/** `vmsr-helper stats` (docs/guide.md "Every VM at a glance"): each refresh is one read per VM's statistics fd and a LIST. */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Command } from 'commander';
import { ResumingV2Client } from '../../client/resuming-client.js';
import { V2Error, type HostUpdate, type VmInfo } from '../../client/v2-replies.js';
import { StatsReader, type StatsSample } from '../../client/stats-reader.js';
import { ENERGY_DOMAINS, type EnergyDomain } from '../../model/domains.js';
import { addClientSocketOption, clientSocket, collect, commandOptions, secondsArg } from '../options.js';
import { E } from '../../protocol/v2/codec.js';
import { UsageError } from '../cli-errors.js';
import { runUntilStopped } from '../stop-signals.js';
import { statedHost } from '../../client/stated-energy-source.js';
import { daemonJsonRecord, energyNotice, vmNotesJson, vmNotesOf, vmNotesText } from '../vm-notes.js';
import type { EnergySourceKind } from '../../energy/kinds.js';
import { wattsOver } from '../../common/watts.js';

const STATS_REFRESH_S = { default: 1, min: 0.1, max: 3600 } as const;

interface StatsOptions {
  socket: string;
  /** Host VM ids or names; absent = every VM the caller may see. */
  vm?: string[];
  intervalS: number;
  once?: boolean;
  json?: boolean;
}

const num = (v: bigint | undefined) => Number(v ?? 0n);

/** One VM's row from one consistent sample of its file: power and energy summed over its vpkgs; ageS null before the first. */
function statsRow(vm: Pick<VmInfo, 'hostVmId' | 'name' | 'pid'>, r: StatsReader, s: StatsSample, nowNs: bigint) {
  const ej = r.scale('energy');
  const energy = (r.values(s, 'energy') ?? []).map((v) => Number(v) * ej);
  const power = (r.values(s, 'power') ?? []).map((v) => Number(v) * r.scale('power'));
  const tids = r.values(s, 'vcpu_tid') ?? [];
  const ve = r.values(s, 'vcpu_energy') ?? [];
  const vt = r.values(s, 'vcpu_cpu_time');
  const t = r.value(s, 'sample_monotonic') ?? 0n;
  const other = r.value(s, 'other_threads_cpu_time');
  return {
    hostVmId: vm.hostVmId,
    name: vm.name,
    pid: vm.pid,
    ended: r.value(s, 'ended') === 1n,
    powerW: power.reduce((a, b) => a + b, 0),
    energyJ: energy.reduce((a, b) => a + b, 0),
    vpkgEnergyJ: energy,
    vcpus: tids.map((tid, i) => ({
      tid: Number(tid),
      energyJ: num(ve[i]) * r.scale('vcpu_energy'),
      cpuS: vt ? num(vt[i]) * r.scale('vcpu_cpu_time') : null,
    })),
    otherCpuS: other === undefined ? null : Number(other) * r.scale('other_threads_cpu_time'),
    ageS: t === 0n ? null : Number(nowNs - t) / 1e9,
    notes: vmNotesOf(r, s),
  };
}

type StatsRow = ReturnType<typeof statsRow>;

function formatStatsTable(rows: readonly StatsRow[]): string[] {
  const head = `${'ID'.padStart(6)}  ${'NAME'.padEnd(20)} ${'PID'.padStart(8)} ${'POWER W'.padStart(9)} ${'ENERGY J'.padStart(12)} ${'VCPUS'.padStart(5)} ${'VCPU CPU s'.padStart(11)}  STATE`;
  const lines = rows.map((r) => {
    const cpu = r.vcpus.every((v) => v.cpuS !== null) ? r.vcpus.reduce((a, v) => a + (v.cpuS ?? 0), 0).toFixed(2) : '-';
    const state = (r.ended ? 'ended' : r.ageS === null ? 'no sample yet' : 'live') + vmNotesText(r.notes);
    return `${String(r.hostVmId).padStart(6)}  ${(r.name ?? '-').slice(0, 20).padEnd(20)} ${String(r.pid).padStart(8)} ${r.powerW.toFixed(2).padStart(9)} ${r.energyJ.toFixed(3).padStart(12)} ${String(r.vcpus.length).padStart(5)} ${cpu.padStart(11)}  ${state}`;
  });
  return [head, ...lines];
}

/** One VM's JSON line; `energySource` is where the helper says its energy comes from (null: not said to this user). */
function formatStatsJson(r: StatsRow, energySource: EnergySourceKind | null): string {
  return JSON.stringify({
    type: 'vm',
    host_vm_id: r.hostVmId,
    name: r.name,
    pid: r.pid,
    ended: r.ended,
    power_w: r.powerW,
    energy_j: r.energyJ,
    vpkg_energy_j: r.vpkgEnergyJ,
    vcpus: r.vcpus.map((v) => ({ tid: v.tid, energy_j: v.energyJ, cpu_s: v.cpuS })),
    other_threads_cpu_s: r.otherCpuS,
    age_s: r.ageS,
    energy_source: energySource,
    ...vmNotesJson(r.notes),
  });
}

/** The host's other domains in `now`, by package then domain, their power since `prev`, the previous refresh's (null: none). */
export function hostDomainRows(prev: HostUpdate | null, now: HostUpdate) {
  const order = (d: { pkg: number; domain: EnergyDomain }) => d.pkg * ENERGY_DOMAINS.length + ENERGY_DOMAINS.indexOf(d.domain);
  return [...(now.domains ?? [])]
    .sort((a, b) => order(a) - order(b))
    .map((d) => {
      const before = prev?.domains?.find((b) => b.pkg === d.pkg && b.domain === d.domain);
      const powerW = before && prev!.tNs !== 0n ? wattsOver(d.energyUj - before.energyUj, Number(now.tNs - prev!.tNs)) : null;
      return { pkg: d.pkg, domain: d.domain, powerW, energyJ: Number(d.energyUj) / 1e6, unattributedJ: Number(d.unattributedUj) / 1e6 };
    });
}

/** The host's domain table under the VMs' (nothing when the host reads only the package). */
type HostDomainRow = ReturnType<typeof hostDomainRows>[number];

export function formatHostDomainTable(rows: readonly HostDomainRow[]): string[] {
  if (rows.length === 0) return [];
  const head = `${'PKG'.padStart(6)}  ${'DOMAIN'.padEnd(8)} ${'POWER W'.padStart(9)} ${'ENERGY J'.padStart(12)} ${'UNATTRIBUTED J'.padStart(15)}`;
  const lines = rows.map(
    (r) =>
      `${String(r.pkg).padStart(6)}  ${r.domain.padEnd(8)} ${(r.powerW === null ? '-' : r.powerW.toFixed(2)).padStart(9)} ${r.energyJ.toFixed(3).padStart(12)} ${r.unattributedJ.toFixed(3).padStart(15)}`,
  );
  return ['', head, ...lines];
}

function formatHostDomainJson(r: HostDomainRow, energySource: EnergySourceKind | null): string {
  return JSON.stringify({
    type: 'host_domain',
    package: r.pkg,
    domain: r.domain,
    power_w: r.powerW,
    energy_j: r.energyJ,
    unattributed_j: r.unattributedJ,
    energy_source: energySource,
  });
}

/** Whether `vm` is one --vm names (an id or a name). */
function chosen(vm: VmInfo, wanted: readonly string[] | undefined): boolean {
  if (!wanted || wanted.length === 0) return true;
  return wanted.some((w) => (/^\d+$/.test(w) ? Number(w) === vm.hostVmId : w === vm.name));
}

export async function runStats(
  o: StatsOptions,
  out: (line: string) => void,
  signal?: AbortSignal,
  warn: (line: string) => void = out,
): Promise<void> {
  // After a helper restart the files of the old image hold its last values: read the new ones.
  let resumed = false;
  const client = await ResumingV2Client.connect(o.socket, { onResumed: () => (resumed = true) });
  const readers = new Map<number, { vm: VmInfo; r: StatsReader }>();
  try {
    const stated = await statedHost(client);
    const source = stated.energySource;
    const notice = o.json ? null : energyNotice(source);
    if (notice !== null) out(notice);
    // The host's latest HOST_UPDATE; none when this caller may not see it (ERROR 2) or the helper refuses it.
    let host: HostUpdate | null = null;
    host = await client
      .subscribeHost((u) => (host = u), undefined, { domains: true })
      .catch((e: unknown) => {
        if (e instanceof V2Error) return null;
        throw e;
      });
    let hostBefore: HostUpdate | null = null;
    for (let n = 0; ; n++) {
      const vms = (await client.list()).filter((v) => chosen(v, o.vm));
      const listed = new Set(vms.map((v) => v.hostVmId));
      for (const [id, e] of readers) {
        if (listed.has(id) && !resumed) continue;
        e.r.close();
        readers.delete(id);
      }
      resumed = false;
      for (const vm of vms) {
        if (readers.has(vm.hostVmId)) continue;
        try {
          readers.set(vm.hostVmId, { vm, r: StatsReader.open((await client.statsFd(vm.hostVmId)).fd) });
        } catch (e) {
          // A VM that ended between LIST and STATS_FD is gone from the next LIST: not worth a warning.
          // Any other refusal is (a helper out of fds: ERROR 4 says the fix).
          if (e instanceof V2Error) {
            if (e.code !== E.NO_SUCH) warn(`VM ${vm.hostVmId}: ${e.message}`);
          } else throw e;
        }
      }
      if (n === 0 && o.vm && o.vm.length > 0 && readers.size === 0)
        throw new UsageError(`no VM ${o.vm.join(', ')} among the VMs this user may see`);
      const now = process.hrtime.bigint();
      const rows = [...readers.values()].sort((a, b) => a.vm.hostVmId - b.vm.hostVmId).map((e) => statsRow(e.vm, e.r, e.r.read(), now));
      const domainRows = host ? hostDomainRows(hostBefore, host) : [];
      hostBefore = host;
      if (o.json) {
        out(daemonJsonRecord(o.socket, stated));
        for (const r of rows) out(formatStatsJson(r, source));
        for (const r of domainRows) out(formatHostDomainJson(r, source));
      } else for (const l of [...formatStatsTable(rows), ...formatHostDomainTable(domainRows)]) out(l);
      if (o.once || signal?.aborted) return;
      await sleep(o.intervalS * 1000, undefined, { signal }).catch(() => {});
      if (signal?.aborted) return;
      if (!o.json) out('');
    }
  } finally {
    for (const e of readers.values()) e.r.close();
    await client.close();
  }
}

export function addStatsCommand(program: Command): void {
  addClientSocketOption(
    program.command('stats').description("a live table of every VM's energy, power and CPU time, read through the helper's statistics fds"),
  )
    .option('--vm <name|id>', 'only this VM (repeatable)', collect(String))
    .option('--interval <s>', `refresh every S seconds (default ${STATS_REFRESH_S.default})`, secondsArg('--interval', STATS_REFRESH_S))
    .option('--once', 'print one table and exit')
    .option('--json', 'per refresh, a JSON record of the daemon (energy source, domains), then one per VM')
    .action(async (_o: unknown, cmd: Command) => {
      // Its own --interval only: the daemon's --interval (default 1) above it is another option.
      const own = cmd.opts<Omit<StatsOptions, 'intervalS'> & { interval?: number }>();
      const opts = { ...own, socket: clientSocket(commandOptions(cmd)), intervalS: own.interval ?? STATS_REFRESH_S.default };
      await runUntilStopped((out, signal, warn) => runStats(opts, out, signal, warn));
    });
}
