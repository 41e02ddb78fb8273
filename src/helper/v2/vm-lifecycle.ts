/** How a VM leaves (dropped, released, ended), and the "VMs changed" flag HOST_UPDATE carries. */
import type { SamplingService } from '../../sampling/sampling-service.js';
import type { Discovery } from './discovery.js';
import type { VmRegistry } from './vm-registry.js';
import { vmUpdate, type VmUpdateFrame } from './vm-update-frame.js';
import type { LogLimiter } from '../../logging/log-limiter.js';
import { vmLogFields } from './vm-log.js';

/** Samples an ended discovered VM stays listed (ENDED) before it is dropped. */
export const ENDED_DISCOVERED_KEPT_SAMPLES = 5;

interface VmLifecycleParts {
  registry: VmRegistry;
  sampling: Pick<SamplingService, 'engine' | 'unregister'>;
  discovery?: Pick<Discovery, 'forget' | 'current'>;
  /** Sends a dropped VM's last UPDATE to whoever watches it (FanOut.dropped). */
  lastUpdate(vmId: number, last: VmUpdateFrame): void;
  /** Where "VM ended" goes (vm-log.ts); not logged without. */
  vmLog?: LogLimiter;
}

export class VmLifecycle {
  /** A VM appeared, ended, was dropped or changed what LIST shows of it since the last HOST_UPDATE. */
  changed = false;

  constructor(private readonly p: VmLifecycleParts) {}

  /** Drops a VM; whoever still watches it gets a last UPDATE with ENDED. */
  drop(vmId: number): void {
    const { registry, sampling } = this.p;
    const out = sampling.engine.output(vmId);
    if (out) this.p.lastUpdate(vmId, vmUpdate(vmId, out, true));
    const r = registry.get(vmId);
    sampling.unregister(vmId);
    registry.remove(vmId);
    if (r?.discovered && r.live) this.p.discovery?.forget(r.pid);
    this.changed = true;
  }

  /** A registrant lets go: a live discovered VM goes on (its vCPUs from thread names again), any other is dropped. */
  release(vmId: number): void {
    const r = this.p.registry.get(vmId);
    if (r && this.p.registry.release(vmId)) {
      const c = this.p.discovery?.current(r.pid);
      if (c) {
        this.p.sampling.engine.updateVcpus(vmId, c.vcpus);
        r.wholeVmOnly = c.wholeVmOnly;
      }
      this.changed = true;
      return;
    }
    this.drop(vmId);
  }

  /** These VMs' processes ended with the last sample: frozen, listed ENDED. */
  ended(vmIds: readonly number[]): void {
    for (const vmId of vmIds) {
      const r = this.p.registry.get(vmId);
      if (r?.live) {
        const source = r.discovered ? 'discovered' : 'registered';
        this.p.vmLog?.info('VM ended', { vmId, vm: vmLogFields(r), source }, 'VM ended');
      }
      this.p.registry.markEnded(vmId);
      if (r?.discovered) this.p.discovery?.forget(r.pid);
      this.changed = true;
    }
  }

  /** One more sample: an ended VM only discovered (nobody registered it) is dropped once kept long enough. */
  age(): void {
    for (const r of [...this.p.registry.all()]) {
      if (r.live || r.owner !== null || !r.discovered) continue;
      if (++r.endedSamples > ENDED_DISCOVERED_KEPT_SAMPLES) this.drop(r.vmId);
    }
  }
}
