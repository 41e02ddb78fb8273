/**
 * The exporter's own series: vmsr_build_info and prom-client's default process and Node.js metrics (as Go exporters'
 * process_*), less the gauges named _total that promtool's lint refuses (MISNAMED_DEFAULTS). Cost: docs/performance.md.
 */
import { collectDefaultMetrics, Gauge, Registry, type RegistryContentType } from 'prom-client';
import { findPackage } from '../os/package-info.js';

export const BUILD_INFO = 'vmsr_build_info';

/** prom-client's gauges whose names end in _total, which a gauge's must not. */
export const MISNAMED_DEFAULTS = ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total'];

/** A registry with vmsr_build_info and the default process metrics, rendering in `contentType`. */
export function processRegistry(contentType: RegistryContentType): Registry<RegistryContentType> {
  const registry = new Registry<RegistryContentType>();
  registry.setContentType(contentType);
  // The revision is package.json's gitHead, which npm writes.
  const pkg = findPackage();
  new Gauge({
    name: BUILD_INFO,
    help: 'A metric with a constant 1 labeled by the version and source revision of vmsr-helper and the Node.js version that runs it',
    labelNames: ['version', 'revision', 'nodeversion'],
    registers: [registry],
  }).set({ version: pkg?.version ?? 'unknown', revision: pkg?.revision ?? 'unknown', nodeversion: process.version }, 1);
  collectDefaultMetrics({ register: registry });
  for (const name of MISNAMED_DEFAULTS) registry.removeSingleMetric(name);
  return registry;
}
