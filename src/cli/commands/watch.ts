/** `vmsr-helper watch`: a VM's power and energy per vpkg and domain at each UPDATE; NAME|UUID|PID OBSERVEs, --qmp or --pid/--vcpus REGISTER. */
import type { Command } from 'commander';
import { runUntilStopped } from '../stop-signals.js';
import { ResumingV2Client } from '../../client/resuming-client.js';
import { V2ConnectionError, V2Error, type Update, type VmInfo, type VmUpdate } from '../../client/v2-replies.js';
import { describeVm, findVm } from '../../client/find-vm.js';
import { errorCodeName } from '../../protocol/v2/codec.js';
import { QmpError, vmSpecFromQmp } from '../../client/qmp.js';
import type { VcpuSpec } from '../../model/vcpus.js';
import { addClientSocketOption, clientSocket, commandOptions, pidArg, wholeNumberArg, vcpuListArg } from '../options.js';
import { UsageError } from '../cli-errors.js';
import { statedHost, type StatedHost } from '../../client/stated-energy-source.js';
import { daemonJsonRecord, energyNotice, NO_NOTES, vmNotesJson, vmNotesOf, vmNotesText, type VmNotes } from '../vm-notes.js';
import { wattsOver } from '../../common/watts.js';
import { StatsReader } from '../../client/stats-reader.js';

interface WatchOptions {
  socket: string;
  vm?: string;
  qmp?: string;
  pid?: number;
  vcpus?: VcpuSpec[];
  count?: number;
  procRoot?: string;
  json?: boolean;
}

/** Where a live command's lines and warnings go, and what stops it. */
interface Io {
  out: (line: string) => void;
  signal: AbortSignal | undefined;
  warn: (line: string) => void;
}

/** The point an UPDATE's power is measured from: the previous UPDATE, or the VM's baseline (energy 0). */
interface PowerBase {
  tNs: bigint;
  vpkgs: { energyUj: bigint }[];
  /** The other RAPL domains' energy per vpkg (absent: 0, as at the baseline). */
  domains?: { domain: string; vpkgEnergyUj: bigint[] }[];
}

/** Watts from µJ over ns, or null when there is no interval to measure. */
function watts(base: PowerBase | null, u: Update, deltaUj: bigint): number | null {
  return base && u.tNs !== 0n ? wattsOver(deltaUj, Number(u.tNs - base.tNs)) : null;
}

/** `u`'s other RAPL domains (none when the helper sent none): energy, and power since `base` (null: no interval), in all and per vpkg. */
export function domainPowers(base: PowerBase | null, u: Update) {
  return (u.domains ?? []).map((d) => {
    const from = base?.domains?.find((b) => b.domain === d.domain)?.vpkgEnergyUj ?? [];
    const vpkgs = d.vpkgEnergyUj.map((e, g) => ({ powerW: watts(base, u, e - (from[g] ?? 0n)), energyUj: e }));
    const energyUj = d.vpkgEnergyUj.reduce((a, b) => a + b, 0n);
    return { domain: d.domain, powerW: watts(base, u, energyUj - from.reduce((a, b) => a + b, 0n)), energyUj, vpkgs };
  });
}

/** Watts per virtual package between `base` and `u` (null where there is no interval to measure). */
export function powers(base: PowerBase | null, u: Update): (number | null)[] {
  return u.vpkgs.map((v, g) => watts(base, u, v.energyUj - (base?.vpkgs[g]?.energyUj ?? 0n)));
}

const T_WIDTH = 8;
const W_WIDTH = 10;
const J_WIDTH = 13;

/** The column header over formatUpdate's rows: time, each vpkg's power and energy, each other domain's power. */
export function formatHeader(nvpkg: number, domains: readonly string[] = []): string {
  const cols = Array.from({ length: nvpkg }, (_, g) => `${`vpkg${g} W`.padStart(W_WIDTH)} ${`vpkg${g} J`.padStart(J_WIDTH)}`);
  return `${'t'.padStart(T_WIDTH)}  ${[...cols, ...domainCols(domains.map((d) => `${d} W`))].join('  ')}`;
}

/** The domain columns: one block after the vpkgs, separated like them. */
function domainCols(cells: readonly string[]): string[] {
  return cells.length === 0 ? [] : [cells.map((c) => c.padStart(W_WIDTH)).join(' ')];
}

const fmtW = (w: number | null | undefined): string => (w === null || w === undefined ? '-' : w.toFixed(2));

/** One row per UPDATE: power since `base`, energy, time from `originNs` ("-" before the first interval), then the notes. */
export function formatUpdate(base: PowerBase | null, u: Update, originNs: bigint = u.tNs, notes: VmNotes = NO_NOTES): string {
  const p = powers(base, u);
  const parts = u.vpkgs.map((v, g) => `${fmtW(p[g]).padStart(W_WIDTH)} ${(Number(v.energyUj) / 1e6).toFixed(3).padStart(J_WIDTH)}`);
  parts.push(...domainCols(domainPowers(base, u).map((d) => fmtW(d.powerW))));
  const t = u.tNs === 0n ? '-' : `${(Number(u.tNs - originNs) / 1e9).toFixed(1)}s`;
  return `${t.padStart(T_WIDTH)}  ${parts.join('  ')}${vmNotesText(notes, '  ')}${u.ended ? '  (VM ended: values are final)' : ''}`;
}

/** `watch --json`'s object per UPDATE (docs/guide.md "Per-VM energy"); energy_uj a string: exact past 2^53. */
export function formatJsonUpdate(
  base: PowerBase | null,
  u: Update,
  originNs: bigint = u.tNs,
  vm?: VmIdentity,
  notes: VmNotes = NO_NOTES,
): string {
  const p = powers(base, u);
  const vpkgs = u.vpkgs.map(
    (v, g) => `{"vpkg":${g},"power_w":${p[g] ?? null},"energy_uj":"${v.energyUj}","counter":"0x${v.counter.toString(16)}"}`,
  );
  const t = u.tNs === 0n ? 'null' : String(Number(u.tNs - originNs) / 1e9);
  const who = vm ? `,"name":${JSON.stringify(vm.name)},"uuid":${JSON.stringify(vm.uuid)},"pid":${vm.pid}` : '';
  // The other RAPL domains, when the host reads any: a line of a package-only host is as before.
  const ds = domainPowers(base, u).map(
    (d) =>
      `{"domain":"${d.domain}","power_w":${d.powerW},"energy_uj":"${d.energyUj}","vpkgs":[${d.vpkgs
        .map((v, g) => `{"vpkg":${g},"power_w":${v.powerW},"energy_uj":"${v.energyUj}"}`)
        .join(',')}]}`,
  );
  const domains = ds.length > 0 ? `,"domains":[${ds.join(',')}]` : '';
  const g = JSON.stringify(vmNotesJson(notes)).slice(1, -1);
  return `{"type":"update","vm_id":${u.vmId}${who},"t_ns":${u.tNs},"t_s":${t},"ended":${u.ended},"vpkgs":[${vpkgs.join(',')}]${domains}${g ? `,${g}` : ''}}`;
}

/** What every --json line says of the VM, so a line read alone names it. */
type VmIdentity = Pick<VmInfo, 'name' | 'uuid' | 'pid'>;

/** `watch NAME --json`'s first line: the VM found, as LIST shows it. */
function formatJsonVm(vm: VmInfo, energySource: string | null = null): string {
  return JSON.stringify({
    type: 'vm',
    vm_id: vm.hostVmId,
    name: vm.name,
    uuid: vm.uuid,
    pid: vm.pid,
    uid: vm.uid,
    source: vm.source,
    nvpkg: vm.nvpkg,
    whole_vm_only: vm.wholeVmOnly,
    energy_source: energySource,
  });
}

/** `watch NAME`'s first line: which VM is watched, so a wrong pick shows at once. */
function formatVmLine(vm: VmInfo): string {
  const whole = vm.wholeVmOnly ? ' (vCPU threads cannot be told apart: vpkg0 has the whole VM)' : '';
  return `VM ${describeVm(vm)}, ${vm.nvpkg} virtual package(s)${whole}`;
}

const NO_QMP_HINT = "vmsr-helper watch NAME (its name as 'virsh list' shows it, its UUID or its PID)";

/** Runs until Ctrl-C, the VM ending, `count` updates, or the helper going away (rejects). */
export async function runWatch(
  o: WatchOptions,
  out: (line: string) => void,
  signal?: AbortSignal,
  warn: (line: string) => void = out,
): Promise<void> {
  if (o.vm !== undefined) return observeVm(o, o.vm, { out, signal, warn });
  let pid = o.pid;
  let vcpus = o.vcpus;
  let name: string | undefined;
  if (o.qmp !== undefined) {
    const spec = await vmSpecFromQmp(o.qmp, o.procRoot ?? '/proc').catch((e: unknown) => {
      // libvirt keeps its VMs' QMP sockets to itself: a second client waits for a greeting in vain.
      throw e instanceof QmpError ? new Error(`${e.message}; a VM the helper discovered needs no QMP: ${NO_QMP_HINT}`) : e;
    });
    pid = spec.pid;
    vcpus = spec.vcpus;
    name = spec.name;
    if (!o.json) out(`VM ${spec.name ?? '(unnamed)'}: pid ${spec.pid}, vCPUs ${spec.vcpus.map((v) => `${v.tid}:${v.vpkg}`).join(',')}`);
  }
  if (pid === undefined || vcpus === undefined)
    throw new UsageError('give a VM (NAME, UUID or PID), --qmp PATH, or --pid PID with --vcpus TID:VPKG,...');
  const client = await resumingClient(o, warn);
  try {
    // Asked before REGISTER: between REGISTER and SUBSCRIBE a round trip would move the first row's baseline.
    const stated = await statedHost(client);
    const source = stated.energySource;
    const reg = await client.register({ pid, vcpus });
    heading(
      o,
      out,
      stated,
      `{"type":"registered","vm_id":${reg.vmId},"pid":${pid},"name":${JSON.stringify(name ?? null)},"nvpkg":${reg.nvpkg},"power_unit":"0x${reg.powerUnit.toString(16)}","energy_source":${JSON.stringify(source)}}`,
      `registered as vm ${reg.vmId} with ${reg.nvpkg} virtual package(s); guest power unit 0x${reg.powerUnit.toString(16)}`,
    );
    await follow(o, { out, signal, warn }, client, {
      vm: { name: name ?? null, uuid: null, pid },
      nvpkg: reg.nvpkg,
      // A fresh registration counts from its baseline: energy 0.
      start: async (onUpdate, onError) => ({ ack: await client.subscribe(reg.vmId, onUpdate, onError, { domains: true }), from: null }),
    });
    await client.unregister(reg.vmId).catch(() => {});
  } finally {
    await client.close();
  }
}

/** The lines before the rows: with --json the daemon's record then `json`; else `text`, then the energy notice, if any. */
function heading(o: WatchOptions, out: (line: string) => void, stated: StatedHost, json: string, text: string): void {
  const lines = o.json ? [daemonJsonRecord(o.socket, stated), json] : [text, energyNotice(stated.energySource)];
  for (const l of lines) if (l !== null) out(l);
}

/** A connection that follows the helper across its restarts (the same VM, its updates going on), saying so. */
function resumingClient(o: WatchOptions, warn: (line: string) => void, resumed?: () => void): Promise<ResumingV2Client> {
  return ResumingV2Client.connect(o.socket, {
    onResumed: (r) => {
      warn(`note: the helper restarted; following the VM again after ${r.awayMs} ms`);
      resumed?.();
    },
  });
}

/** A VM's statistics file for the notes of each row, reopened after a helper restart (the old file keeps its last values). */
function vmFileNotes(client: ResumingV2Client, hostVmId: number) {
  let r: StatsReader | null = null;
  const close = () => {
    r?.close();
    r = null;
  };
  return {
    close,
    read: (): VmNotes => (r === null ? NO_NOTES : vmNotesOf(r, r.read())),
    async reopen(): Promise<void> {
      close();
      r = await client
        .statsFd(hostVmId)
        .then(({ fd }) => StatsReader.open(fd))
        .catch(() => null);
    },
  };
}

/** `watch NAME|UUID|PID`: the VM from the helper's LIST, OBSERVEd (nothing registered, nothing to undo). */
async function observeVm(o: WatchOptions, target: string, io: Io): Promise<void> {
  let guest: ReturnType<typeof vmFileNotes> | undefined;
  const client = await resumingClient(o, io.warn, () => void guest?.reopen());
  try {
    const vm = findVm(await client.list(), target, 'vmsr-helper watch');
    guest = vmFileNotes(client, vm.hostVmId);
    await guest.reopen();
    const stated = await statedHost(client);
    heading(o, io.out, stated, formatJsonVm(vm, stated.energySource), formatVmLine(vm));
    const file = guest;
    await follow(o, io, client, {
      vm: { name: vm.name, uuid: vm.uuid, pid: vm.pid },
      nvpkg: vm.nvpkg,
      notes: () => file.read(),
      // An observed VM's energy counts from its discovery: power is measured from the values now.
      start: async (onUpdate, onError) => {
        const now = fromObserved(await client.observe(vm.hostVmId, (u) => onUpdate(fromObserved(u)), onError, { domains: true }));
        return { ack: now, from: now.tNs === 0n ? null : now };
      },
    });
  } finally {
    guest?.close();
    await client.close();
  }
}

function fromObserved({ hostVmId, ...u }: VmUpdate): Update {
  return { vmId: hostVmId, ...u };
}

interface Follow {
  vm: VmIdentity;
  nvpkg: number;
  notes?: () => VmNotes;
  /** Starts the updates; resolves with the acknowledging update and the values power is measured from (null: energy 0). */
  start(onUpdate: (u: Update) => void, onError: (e: V2Error) => void): Promise<{ ack: Update; from: Update | null }>;
}

/** Prints each update until Ctrl-C, the VM ending, `count` updates, or the connection closing (rejects). */
async function follow(o: WatchOptions, { out, signal, warn }: Io, client: ResumingV2Client, f: Follow): Promise<void> {
  // The helper's t_ns is CLOCK_MONOTONIC, the same clock as hrtime here (same host, Unix socket).
  const zeroBase = (): PowerBase => ({ tNs: process.hrtime.bigint(), vpkgs: [] });
  let base: PowerBase = zeroBase();
  let origin: bigint | undefined;
  let seen = 0;
  await new Promise<void>((resolve, reject) => {
    // Updates read in the same chunk as start's reply come before start resolves: they wait for it,
    // so power is never measured from the wrong base.
    let early: Update[] | null = [];
    const onUpdate = (u: Update) => {
      if (early !== null) early.push(u);
      else show(u);
    };
    const show = (u: Update) => {
      if (u.tNs === 0n) {
        // Before the VM's first interval. Its baseline sample (energy 0) is taken at REGISTER when
        // the helper is idle, else at the helper's next tick, which sends subscribers this UPDATE:
        // either way the last such arrival is the baseline's time, within a round trip.
        base = zeroBase();
        if (!u.ended) return;
      } else if (!u.ended && u.tNs <= base.tNs) {
        // The sample the start's reply already gave (OBSERVE answers with the last sample's values,
        // and that sample's UPDATE may follow): nothing new, and no interval to measure.
        return;
      }
      origin ??= u.tNs;
      const notes = f.notes?.();
      out(o.json ? formatJsonUpdate(base, u, origin, f.vm, notes) : formatUpdate(base, u, origin, notes));
      if (u.tNs !== 0n) base = u;
      if (u.ended || (o.count !== undefined && ++seen >= o.count)) resolve();
    };
    const onError = (e: V2Error) => warn(`warning: ${errorCodeName(e.code)}: ${e.helperMessage}`);
    f.start(onUpdate, onError).then(({ ack, from }) => {
      const domains = ack.domains?.map((d) => d.domain);
      if (!o.json) out(formatHeader(f.nvpkg, domains));
      if (from !== null) base = from;
      const queued = early ?? [];
      early = null;
      for (const u of queued) show(u);
    }, reject);
    void client.closed.then((err) => reject(err ?? new V2ConnectionError('the helper closed the connection')));
    // Ctrl-C while connecting or registering aborted before this listener existed.
    if (signal?.aborted) resolve();
    else signal?.addEventListener('abort', () => resolve(), { once: true });
  });
}

export function addWatchCommand(program: Command): void {
  addClientSocketOption(
    program
      .command('watch')
      .description(
        "print a VM's power and energy per virtual package, live: a VM the helper found (NAME, UUID or PID), or one registered here",
      )
      .argument('[vm]', "a VM the helper lists: its name (as 'virsh list' shows it), UUID or PID; observed, no QMP needed"),
  )
    .option('--qmp <path>', "the VM's QMP socket (vCPU threads and sockets are asked from QEMU)")
    .option('--pid <pid>', 'the VM process (with --vcpus)', pidArg)
    .option('--vcpus <list>', 'TID:VPKG,... vCPU threads and their virtual package (with --pid)', vcpuListArg)
    .option('--count <n>', 'stop after N updates', wholeNumberArg('--count'))
    .option('--json', 'one JSON object per line (a "daemon" record, a "vm" or "registered" one, then one "update" per sample) for scripts')
    .action(async (vm: string | undefined, _o: unknown, cmd: Command) => {
      // -k may be taken by the root command's parser (the daemon's -k); both mean the same socket.
      const all = commandOptions<Partial<WatchOptions>>(cmd);
      const opts = { ...all, socket: clientSocket(all), ...(vm !== undefined ? { vm } : {}) };
      const ways = [vm !== undefined, opts.qmp !== undefined, opts.pid !== undefined].filter(Boolean).length;
      if (ways !== 1) throw new UsageError('give one of: a VM (NAME, UUID or PID), --qmp PATH, or --pid PID --vcpus TID:VPKG,...');
      if (opts.pid !== undefined && opts.vcpus === undefined) throw new UsageError('--pid needs --vcpus TID:VPKG,...');
      // QMP names the vCPU threads itself; a --vcpus beside it would be silently ignored.
      if (opts.qmp !== undefined && opts.vcpus !== undefined)
        throw new UsageError('--vcpus goes with --pid, not --qmp (QEMU lists its vCPU threads)');
      await runUntilStopped((out, signal, warn) => runWatch(opts, out, signal, warn)).catch((e: unknown) => {
        throw e instanceof V2Error ? new Error(`the helper refused ${e.message}`) : e;
      });
    });
}
