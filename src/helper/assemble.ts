/** The assembly of the service chain: host info -> energy source -> task reader -> sampler -> v2 service. */
import { readHostInfo } from '../msr/host-info.js';
import { MsrEnergySource } from '../msr/energy-source.js';
import { ProcTaskReader } from '../os/proc-tasks.js';
import { Sampler } from '../sampling/sampler.js';
import { TraceWriter } from '../trace/writer.js';
import { ProcScanner } from '../discovery/scanner.js';
import type { DaemonPlugin } from './daemon.js';
import { createV2Service, type V2Limits } from './v2/service.js';

/**
 * The v2 service as a daemon plugin: host facts and package energy from the daemon's MSR fds (opened
 * before the privilege drop, as is the trace file), /proc from the configured root.
 */
/** What the daemon's command line decides for the v2 service. */
export interface V2DaemonSettings {
  intervalMs: number;
  limits: V2Limits;
  recordPath?: string;
  /** Scan /proc for QEMU/KVM processes (default on; --no-discovery). */
  discovery: boolean;
  /** --observer-group, resolved. */
  observerGid?: number;
}

export function v2DaemonPlugin(o: V2DaemonSettings): DaemonPlugin {
  return {
    name: 'v2',
    setup(ctx) {
      const log = ctx.area('v2');
      const paths = ctx.config.hostPaths;
      const host = readHostInfo({ paths, device: ctx.device, vendor: ctx.vendor });
      const tasks = new ProcTaskReader(paths.procRoot);
      const sampler = new Sampler(new MsrEnergySource(ctx.device, host.cpus, ctx.vendor), tasks);
      // The daemon replaces its trace at each start (docs/recording.md): refusing would turn a
      // systemd restart into a restart loop.
      const trace = o.recordPath !== undefined ? TraceWriter.open(o.recordPath, { host, note: `recorded live by the vmsr-helper daemon (v2 service, interval ${o.intervalMs} ms)` }, { overwrite: true, fd: ctx.openedFile(o.recordPath) }) : undefined;
      const discovery = o.discovery ? new ProcScanner(paths.procRoot, { clkTck: host.clkTck }) : undefined;
      const service = createV2Service({
        host,
        sampler,
        procRoot: paths.procRoot,
        intervalMs: o.intervalMs,
        limits: o.limits,
        trace,
        forgetPid: (pid) => tasks.forget(pid),
        openPid: (pid) => void tasks.read(pid),
        fds: ctx.fds,
        log,
        ...(discovery ? { discovery, deferDiscovery: true } : {}),
        ...(o.observerGid !== undefined ? { observerGid: o.observerGid } : {}),
        health: ctx.health,
      });
      // The first scan runs with the privileges the daemon keeps, not those it starts with.
      ctx.onReady(() => service.startDiscovery());
      ctx.onShutdown(async () => {
        await service.close();
        tasks.close();
        await trace?.close();
      });
      log.info({ intervalMs: o.intervalMs, limits: o.limits, record: o.recordPath ?? null, discovery: o.discovery, observerGid: o.observerGid ?? null }, 'v2 service ready');
      return { v2Handler: service.handler };
    },
  };
}
