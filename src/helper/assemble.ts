/** The assembly of the service chain: host info -> energy source -> task reader -> sampler -> v2 service. */
import { readHostInfo } from '../msr/host-info.js';
import { msrErrorWithHint } from '../msr/device.js';
import { MsrEnergySource } from '../msr/energy-source.js';
import { ProcTaskReader } from '../os/proc-tasks.js';
import { Sampler } from '../sampling/sampler.js';
import { TraceWriter } from '../trace/writer.js';
import type { DaemonPlugin } from './daemon.js';
import { createV2Service, type V2Limits } from './v2/service.js';

/**
 * The v2 service as a daemon plugin: host facts and package energy from the daemon's MSR fds (opened
 * before the privilege drop, as is the trace file), /proc from the configured root.
 */
export function v2DaemonPlugin(o: { intervalMs: number; limits: V2Limits; recordPath?: string }): DaemonPlugin {
  return {
    name: 'v2',
    setup(ctx) {
      const log = ctx.area('v2');
      const paths = ctx.config.hostPaths;
      let host;
      try {
        host = readHostInfo({ paths, device: ctx.device, vendor: ctx.vendor });
      } catch (e) {
        throw msrErrorWithHint(e);
      }
      const tasks = new ProcTaskReader(paths.procRoot);
      const sampler = new Sampler(new MsrEnergySource(ctx.device, host.cpus, ctx.vendor), tasks);
      // The daemon replaces its trace at each start (docs/recording.md): refusing would turn a
      // systemd restart into a restart loop.
      const trace = o.recordPath !== undefined ? TraceWriter.open(o.recordPath, { host, note: `recorded live by the vmsr-helper daemon (v2 service, interval ${o.intervalMs} ms)` }, { overwrite: true }) : undefined;
      const service = createV2Service({
        host,
        sampler,
        procRoot: paths.procRoot,
        intervalMs: o.intervalMs,
        limits: o.limits,
        trace,
        forgetPid: (pid) => tasks.forget(pid),
        log,
      });
      ctx.onShutdown(async () => {
        await service.close();
        tasks.close();
        await trace?.close();
      });
      log.info({ intervalMs: o.intervalMs, limits: o.limits, record: o.recordPath ?? null }, 'v2 service ready');
      return { v2Handler: service.handler };
    },
  };
}
