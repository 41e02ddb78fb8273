/** VMs the /proc scan finds join the service when their threads fit the fd budget (else deferred); a registration gains name and UUID. */
import type { DiscoveredVm } from '../../discovery/scanner.js';
import type { Sample } from '../../model/sample.js';
import type { SamplingService } from '../../sampling/sampling-service.js';
import type { Discovery } from './discovery.js';
import { runInSlices } from '../../sampling/time-slices.js';
import type { FdAdmitter, VmRegistry } from './vm-registry.js';
import type { LogLimiter } from '../../logging/log-limiter.js';
import { vmLogFields } from './vm-log.js';

interface DiscoveredVmsParts {
  discovery: Pick<Discovery, 'scanSteps' | 'refine' | 'defer'>;
  registry: VmRegistry;
  sampling: Pick<SamplingService, 'register' | 'engine'>;
  fds?: FdAdmitter;
  /** Opens what sampling the pid needs (ProcTaskReader.read); throws when it cannot (the VM is deferred). */
  openPid?: (pid: number) => void;
  /** The limiter of the VM lines (vm-log.ts). */
  vmLog: LogLimiter;
  /** A VM arrived or changed what LIST shows of it (VmLifecycle.changed). */
  changed(): void;
}

export class DiscoveredVms {
  /** pids of VMs not admitted, so the warning is logged once per VM. */
  private readonly deferred = new Set<number>();

  constructor(private readonly p: DiscoveredVmsParts) {}

  /** Before each sample: the scan in slices, clients served between them; resolves once done (or `stopped`). */
  async scanInSlices(stopped: () => boolean): Promise<void> {
    await runInSlices(this.p.discovery.scanSteps(), (d) => d !== null && this.admit(d), { stopped });
  }

  admit(d: DiscoveredVm): void {
    const { registry, sampling } = this.p;
    const reg = registry.registrationOf(d.pid, d.starttime);
    const meta = { name: d.name, uuid: d.uuid, wholeVmOnly: d.wholeVmOnly };
    if (reg !== undefined) {
      // One process, one VM: the registration keeps its vCPU list; LIST gains the name and UUID.
      registry.addDiscovered(reg.vmId, d.pid, d.starttime, d.uid, meta);
      return;
    }
    const fit = this.p.fds?.canAdmit(d.threads, d.pid);
    let err = fit && !fit.ok ? fit.error : null;
    if (err === null && this.p.openPid) {
      try {
        this.p.openPid(d.pid);
      } catch (e) {
        err = (e as Error).message;
      }
    }
    if (err !== null) {
      this.p.discovery.defer(d.pid);
      if (!this.deferred.has(d.pid))
        this.p.vmLog.warn('VM discovered but not sampled', { vm: vmLogFields(d), err }, 'VM discovered but not sampled');
      this.deferred.add(d.pid);
      return;
    }
    this.deferred.delete(d.pid);
    const spec = { pid: d.pid, starttime: d.starttime, vcpus: d.vcpus, ...(d.name !== null ? { name: d.name } : {}) };
    const vmId = sampling.register(spec);
    registry.addDiscovered(vmId, d.pid, d.starttime, d.uid, meta);
    this.p.changed();
    const seen = { vmId, vm: vmLogFields(d), vcpus: d.vcpus.length, nvpkg: sampling.engine.nvpkg(vmId), wholeVmOnly: d.wholeVmOnly };
    this.p.vmLog.info('VM discovered', d.problems.length > 0 ? { ...seen, problems: d.problems } : seen, 'VM discovered');
  }

  /** Each sample, before the engine: new vCPU threads of discovered VMs, from their stat lines. */
  refine(s: Sample): void {
    for (const r of this.p.registry.all()) {
      if (!r.discovered || !r.live) continue;
      const lines = s.tasks.get(r.pid);
      if (lines === undefined) continue;
      const c = this.p.discovery.refine(r.pid, lines);
      // A registrant's vCPU list stands while it holds the VM.
      if (c === null || r.owner !== null) continue;
      this.p.sampling.engine.updateVcpus(r.vmId, c.vcpus);
      if (r.wholeVmOnly !== c.wholeVmOnly) this.p.changed();
      r.wholeVmOnly = c.wholeVmOnly;
    }
  }
}
