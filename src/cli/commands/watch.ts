/**
 * `vmsr-helper watch`: registers one VM over v2 and prints each virtual package's power and energy
 * at every UPDATE (a table under a column header, or --json lines), until Ctrl-C or the VM ends. The
 * VM comes from its QMP socket or from --pid/--vcpus.
 */
import type { Command } from 'commander';
import { DisposableStore, listen } from '../../common/disposable.js';
import { V2Client, V2ConnectionError, V2Error, type Update } from '../../client/v2-client.js';
import { errorCodeName } from '../../protocol/v2/codec.js';
import { vmSpecFromQmp } from '../../client/qmp-vm.js';
import type { VcpuSpec } from '../../ratio/types.js';
import { DEFAULT_HELPER_SOCKET } from '../../protocol/socket-path.js';
import { addClientSocketOption, commandOptions, pidArg, positiveIntArg, vcpuListArg } from '../options.js';
import { UsageError } from '../cli-errors.js';
import { statedEnergySource } from '../../client/stated-energy-source.js';
import { energyNotice } from '../energy-notice.js';

export interface WatchOptions {
  socket: string;
  qmp?: string;
  pid?: number;
  vcpus?: VcpuSpec[];
  /** Stop after this many UPDATEs after the first (tests, scripts). */
  count?: number;
  procRoot?: string;
  /** One JSON object per line (formatJsonUpdate) instead of the table. */
  json?: boolean;
}

/** The point an UPDATE's power is measured from: the previous UPDATE, or the VM's baseline (energy 0). */
export interface PowerBase {
  tNs: bigint;
  vpkgs: { energyUj: bigint }[];
}

/** Watts per virtual package between `base` and `u` (null where there is no interval to measure). */
export function powers(base: PowerBase | null, u: Update): (number | null)[] {
  const dtNs = base ? Number(u.tNs - base.tNs) : 0;
  return u.vpkgs.map((v, g) =>
    base && u.tNs !== 0n && dtNs > 0 ? (Number(v.energyUj - (base.vpkgs[g]?.energyUj ?? 0n)) * 1e3) / dtNs : null,
  );
}

const T_WIDTH = 8;
const W_WIDTH = 10;
const J_WIDTH = 13;

/** The column header over formatUpdate's rows: time, then power and energy of each virtual package. */
export function formatHeader(nvpkg: number): string {
  const cols = Array.from({ length: nvpkg }, (_, g) => `${`vpkg${g} W`.padStart(W_WIDTH)} ${`vpkg${g} J`.padStart(J_WIDTH)}`);
  return `${'t'.padStart(T_WIDTH)}  ${cols.join('  ')}`;
}

/**
 * One row per UPDATE: power from the energy delta over the time delta since `base`, and the running
 * energy. Time is counted from `originNs` (the first sample watched); t_ns itself is the helper's
 * monotonic clock, which means nothing to a reader. An UPDATE from before the first interval (t_ns 0)
 * shows "-".
 */
export function formatUpdate(base: PowerBase | null, u: Update, originNs: bigint = u.tNs): string {
  const p = powers(base, u);
  const parts = u.vpkgs.map((v, g) => {
    const w = p[g];
    return `${(w === null || w === undefined ? '-' : w.toFixed(2)).padStart(W_WIDTH)} ${(Number(v.energyUj) / 1e6).toFixed(3).padStart(J_WIDTH)}`;
  });
  const t = u.tNs === 0n ? '-' : `${(Number(u.tNs - originNs) / 1e9).toFixed(1)}s`;
  return `${t.padStart(T_WIDTH)}  ${parts.join('  ')}${u.ended ? '  (VM ended: values are final)' : ''}`;
}

/**
 * `watch --json`: one object per UPDATE. t_ns is the helper's CLOCK_MONOTONIC as a bare integer (as in
 * traces); energy_uj a decimal string (exact past 2^53, like replay --json); power_w a float, null
 * when there is no interval yet.
 */
export function formatJsonUpdate(base: PowerBase | null, u: Update, originNs: bigint = u.tNs): string {
  const p = powers(base, u);
  const vpkgs = u.vpkgs.map(
    (v, g) => `{"vpkg":${g},"power_w":${p[g] ?? null},"energy_uj":"${v.energyUj}","counter":"0x${v.counter.toString(16)}"}`,
  );
  const t = u.tNs === 0n ? 'null' : String(Number(u.tNs - originNs) / 1e9);
  return `{"type":"update","vm_id":${u.vmId},"t_ns":${u.tNs},"t_s":${t},"ended":${u.ended},"vpkgs":[${vpkgs.join(',')}]}`;
}

export function describeError(e: unknown): string {
  if (e instanceof V2Error) return `the helper refused ${e.message}`;
  return e instanceof Error ? e.message : String(e);
}

/** Runs until Ctrl-C, the VM ending, `count` updates, or the helper going away (rejects). */
export async function runWatch(
  o: WatchOptions,
  out: (line: string) => void,
  signal?: AbortSignal,
  warn: (line: string) => void = out,
): Promise<void> {
  let pid = o.pid;
  let vcpus = o.vcpus;
  let name: string | undefined;
  if (o.qmp !== undefined) {
    const spec = await vmSpecFromQmp(o.qmp, o.procRoot ?? '/proc');
    pid = spec.pid;
    vcpus = spec.vcpus;
    name = spec.name;
    if (!o.json) out(`VM ${spec.name ?? '(unnamed)'}: pid ${spec.pid}, vCPUs ${spec.vcpus.map((v) => `${v.tid}:${v.vpkg}`).join(',')}`);
  }
  if (pid === undefined || vcpus === undefined) throw new UsageError('give --qmp PATH, or --pid PID with --vcpus TID:VPKG,...');
  const client = await V2Client.connect(o.socket);
  try {
    // Asked before REGISTER: between REGISTER and SUBSCRIBE a round trip would move the first row's baseline.
    const source = await statedEnergySource(client);
    const reg = await client.register({ pid, vcpus });
    // The helper's t_ns is CLOCK_MONOTONIC, the same clock as hrtime here (same host, Unix socket).
    const zeroBase = (): PowerBase => ({ tNs: process.hrtime.bigint(), vpkgs: [] });
    let base: PowerBase = zeroBase();
    if (o.json) {
      out(
        `{"type":"registered","vm_id":${reg.vmId},"pid":${pid},"name":${JSON.stringify(name ?? null)},"nvpkg":${reg.nvpkg},"power_unit":"0x${reg.powerUnit.toString(16)}","energy_source":${JSON.stringify(source)}}`,
      );
    } else {
      out(`registered as vm ${reg.vmId} with ${reg.nvpkg} virtual package(s); guest power unit 0x${reg.powerUnit.toString(16)}`);
      const notice = energyNotice(source);
      if (notice !== null) out(notice);
      out(formatHeader(reg.nvpkg));
    }
    let origin: bigint | undefined;
    let seen = 0;
    await new Promise<void>((resolve, reject) => {
      const onUpdate = (u: Update) => {
        if (u.tNs === 0n) {
          // Before the VM's first interval. Its baseline sample (energy 0) is taken at REGISTER when
          // the helper is idle, else at the helper's next tick, which sends subscribers this UPDATE:
          // either way the last such arrival is the baseline's time, within a round trip.
          base = zeroBase();
          if (!u.ended) return;
        }
        origin ??= u.tNs;
        out((o.json ? formatJsonUpdate : formatUpdate)(base, u, origin));
        if (u.tNs !== 0n) base = u;
        if (u.ended || (o.count !== undefined && ++seen >= o.count)) resolve();
      };
      const onError = (e: V2Error) => warn(`warning: ${errorCodeName(e.code)}: ${e.helperMessage}`);
      client.subscribe(reg.vmId, onUpdate, onError).catch(reject);
      void client.closed.then((err) => reject(err ?? new V2ConnectionError('the helper closed the connection')));
      // Ctrl-C while connecting or registering aborted before this listener existed.
      if (signal?.aborted) resolve();
      else signal?.addEventListener('abort', () => resolve(), { once: true });
    });
    await client.unregister(reg.vmId).catch(() => {});
  } finally {
    await client.close();
  }
}

export function addWatchCommand(program: Command): void {
  addClientSocketOption(
    program.command('watch').description("register a VM over the v2 protocol and print its virtual packages' power and energy, live"),
  )
    .option('--qmp <path>', "the VM's QMP socket (vCPU threads and sockets are asked from QEMU)")
    .option('--pid <pid>', 'the VM process (with --vcpus)', pidArg)
    .option('--vcpus <list>', 'TID:VPKG,... vCPU threads and their virtual package (with --pid)', vcpuListArg)
    .option('--count <n>', 'stop after N updates', positiveIntArg('--count'))
    .option('--json', 'one JSON object per line (a "registered" record, then one "update" per sample) for scripts')
    .action(async (_o: unknown, cmd: Command) => {
      // -k may be taken by the root command's parser (the daemon's -k); both mean the same socket.
      const all = commandOptions<{ socket?: string; qmp?: string; pid?: number; vcpus?: VcpuSpec[]; count?: number; json?: boolean }>(cmd);
      const opts = { ...all, socket: all.socket ?? DEFAULT_HELPER_SOCKET };
      if ((opts.qmp === undefined) === (opts.pid === undefined))
        throw new UsageError('give either --qmp PATH or --pid PID --vcpus TID:VPKG,...');
      if (opts.pid !== undefined && opts.vcpus === undefined) throw new UsageError('--pid needs --vcpus TID:VPKG,...');
      // QMP names the vCPU threads itself; a --vcpus beside it would be silently ignored.
      if (opts.qmp !== undefined && opts.vcpus !== undefined)
        throw new UsageError('--vcpus goes with --pid, not --qmp (QEMU lists its vCPU threads)');
      const ac = new AbortController();
      const signals = new DisposableStore();
      for (const sig of ['SIGINT', 'SIGTERM']) signals.add(listen(process, sig, () => ac.abort()));
      try {
        await runWatch(
          opts,
          (l) => process.stdout.write(`${l}\n`),
          ac.signal,
          (l) => process.stderr.write(`${l}\n`),
        );
      } catch (e) {
        if (e instanceof UsageError) throw e;
        throw new Error(describeError(e));
      } finally {
        signals.dispose();
      }
    });
}
