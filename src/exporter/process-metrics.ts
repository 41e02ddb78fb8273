/**
 * The exporter's own series, as Prometheus users expect them of any exporter: vmsr_build_info
 * (version, revision, Node version; 1, like node_exporter's build_info) and prom-client's default
 * process and Node.js metrics. Those keep their usual names without a prefix (process_cpu_seconds_total,
 * process_resident_memory_bytes, process_open_fds, nodejs_*), the names Go exporters use for the
 * process_* series, so a dashboard or alert written for those works unchanged; the job and instance
 * labels tell exporters apart. Left out: the three gauges prom-client names with _total
 * (MISNAMED_DEFAULTS), which promtool's lint refuses (a gauge must not end in _total); the families
 * without the suffix carry the same counts by type. One registry per exposition format, as in metrics.ts.
 *
 * Cost: about 2 ms of CPU per scrape on the 2-core test machine (reading /proc/self/stat, status,
 * limits and fd, and V8's heap statistics), nothing between scrapes but the event-loop delay monitor.
 */
import { collectDefaultMetrics, Gauge, Registry, type RegistryContentType } from 'prom-client';
import { findPackage } from '../os/package-info.js';

export const BUILD_INFO = 'vmsr_build_info';

/** prom-client's gauges whose names end in _total, which a gauge's must not. */
export const MISNAMED_DEFAULTS = ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total'];

interface BuildInfo {
  version: string;
  /** The source revision when the package records it (package.json's gitHead, which npm writes), else "unknown". */
  revision: string;
  nodeversion: string;
}

function buildInfo(): BuildInfo {
  const pkg = findPackage();
  return { version: pkg?.version ?? 'unknown', revision: pkg?.revision ?? 'unknown', nodeversion: process.version };
}

/** A registry with vmsr_build_info and the default process metrics, rendering in `contentType`. */
export function processRegistry(contentType: RegistryContentType): Registry<RegistryContentType> {
  const registry = new Registry<RegistryContentType>();
  registry.setContentType(contentType);
  const info = buildInfo();
  new Gauge({
    name: BUILD_INFO,
    help: 'A metric with a constant 1 labeled by the version and source revision of vmsr-helper and the Node.js version that runs it',
    labelNames: ['version', 'revision', 'nodeversion'],
    registers: [registry],
  }).set({ ...info }, 1);
  collectDefaultMetrics({ register: registry });
  for (const name of MISNAMED_DEFAULTS) registry.removeSingleMetric(name);
  return registry;
}
