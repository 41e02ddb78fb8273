/**
 * `vmsr-helper watch`: registers one VM over v2 and prints each virtual package's power and energy
 * at every UPDATE, until Ctrl-C or the VM ends. The VM comes from its QMP socket or from --pid/--vcpus.
 */
import type { Command } from 'commander';
import { V2Client, V2ConnectionError, V2Error, type Update } from '../../client/v2-client.js';
import { errorCodeName } from '../../protocol/v2/codec.js';
import { vmSpecFromQmp } from '../../client/vm-spec.js';
import type { VcpuSpec } from '../../ratio/types.js';
import { DEFAULT_SOCKET } from './daemon.js';
import { pidArg, positiveIntArg, vcpuListArg } from '../options.js';

export interface WatchOptions {
  socket: string;
  qmp?: string;
  pid?: number;
  vcpus?: VcpuSpec[];
  /** Stop after this many UPDATEs after the first (tests, scripts). */
  count?: number;
  procRoot?: string;
}

/**
 * One line per UPDATE: power from the energy delta over the time delta, and the running energy. Time
 * is counted from `originNs` (the first sample watched); t_ns itself is the helper's monotonic clock,
 * which means nothing to a reader. An UPDATE from before the first interval (t_ns 0) shows "t=-".
 */
export function formatUpdate(prev: Update | null, u: Update, originNs: bigint = u.tNs): string {
  const dtNs = prev ? Number(u.tNs - prev.tNs) : 0;
  const parts = u.vpkgs.map((v, g) => {
    const j = Number(v.energyUj) / 1e6;
    const p = prev && dtNs > 0 ? (Number(v.energyUj - (prev.vpkgs[g]?.energyUj ?? 0n)) * 1e3) / dtNs : NaN;
    return `vpkg${g} ${Number.isNaN(p) ? '    -   ' : `${p.toFixed(2).padStart(7)} W`} ${j.toFixed(3).padStart(10)} J`;
  });
  const t = u.tNs === 0n ? '-' : `${(Number(u.tNs - originNs) / 1e9).toFixed(1)}s`;
  return `t=${t.padStart(7)}  ${parts.join('  ')}${u.ended ? '  (VM ended: values are final)' : ''}`;
}

export function describeError(e: unknown): string {
  if (e instanceof V2Error) return `the helper refused ${e.message}`;
  return e instanceof Error ? e.message : String(e);
}

/** Runs until Ctrl-C, the VM ending, `count` updates, or the helper going away (rejects). */
export async function runWatch(o: WatchOptions, out: (line: string) => void, signal?: AbortSignal): Promise<void> {
  let pid = o.pid;
  let vcpus = o.vcpus;
  if (o.qmp !== undefined) {
    const spec = await vmSpecFromQmp(o.qmp, o.procRoot ?? '/proc');
    pid = spec.pid;
    vcpus = spec.vcpus;
    out(`VM ${spec.name ?? '(unnamed)'}: pid ${spec.pid}, vCPUs ${spec.vcpus.map((v) => `${v.tid}:${v.vpkg}`).join(',')}`);
  }
  if (pid === undefined || vcpus === undefined) throw new Error('give --qmp PATH, or --pid PID with --vcpus TID:VPKG,...');
  const client = await V2Client.connect(o.socket);
  try {
    const reg = await client.register({ pid, vcpus });
    out(`registered as vm ${reg.vmId} with ${reg.nvpkg} virtual package(s); guest power unit 0x${reg.powerUnit.toString(16)}`);
    let prev: Update | null = null;
    let origin: bigint | undefined;
    let seen = 0;
    await new Promise<void>((resolve, reject) => {
      const onUpdate = (u: Update) => {
        if (u.tNs !== 0n) origin ??= u.tNs;
        out(formatUpdate(prev, u, origin));
        // The immediate UPDATE before the first interval carries t_ns 0; it is not a baseline.
        if (u.tNs !== 0n) prev = u;
        if (u.ended || (o.count !== undefined && ++seen > o.count)) resolve();
      };
      const onError = (e: V2Error) => out(`warning: ${errorCodeName(e.code)}: ${e.helperMessage}`);
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
  program
    .command('watch')
    .description("register a VM over the v2 protocol and print its virtual packages' power and energy, live")
    .option('-k, --socket <path>', `the helper's socket (default '${DEFAULT_SOCKET}')`)
    .option('--qmp <path>', "the VM's QMP socket (vCPU threads and sockets are asked from QEMU)")
    .option('--pid <pid>', 'the VM process (with --vcpus)', pidArg)
    .option('--vcpus <list>', 'TID:VPKG,... vCPU threads and their virtual package (with --pid)', vcpuListArg)
    .option('--count <n>', 'stop after N updates', positiveIntArg('--count'))
    .action(async (_o: unknown, cmd: Command) => {
      // -k may be taken by the root command's parser (the daemon's -k); both mean the same socket.
      const all = cmd.optsWithGlobals<{ socket?: string; qmp?: string; pid?: number; vcpus?: VcpuSpec[]; count?: number }>();
      const opts = { ...all, socket: all.socket ?? DEFAULT_SOCKET };
      if ((opts.qmp === undefined) === (opts.pid === undefined)) throw new Error('give either --qmp PATH or --pid PID --vcpus TID:VPKG,...');
      if (opts.pid !== undefined && opts.vcpus === undefined) throw new Error('--pid needs --vcpus TID:VPKG,...');
      // QMP names the vCPU threads itself; a --vcpus beside it would be silently ignored.
      if (opts.qmp !== undefined && opts.vcpus !== undefined) throw new Error('--vcpus goes with --pid, not --qmp (QEMU lists its vCPU threads)');
      const ac = new AbortController();
      const stop = () => ac.abort();
      process.once('SIGINT', stop);
      process.once('SIGTERM', stop);
      try {
        await runWatch(opts, (l) => process.stdout.write(`${l}\n`), ac.signal);
      } catch (e) {
        throw new Error(describeError(e));
      } finally {
        process.off('SIGINT', stop);
        process.off('SIGTERM', stop);
      }
    });
}
