/** Live VMs not sampled whole (over their fd share, or no fds left): LIST's NOT_WHOLE, and a rate-limited warning when one stops being. */
import type { NotWhole } from '../../os/proc-tasks.js';
import type { LogLimiter } from '../../logging/log-limiter.js';
import type { VmRegistry } from './vm-registry.js';

interface WholeVmsParts {
  registry: Pick<VmRegistry, 'all'>;
  /** The task reader's word on a pid (ProcTaskReader.notWhole). */
  notWhole: (pid: number) => NotWhole | null;
  limiter: Pick<LogLimiter, 'warn'>;
  /** What LIST shows changed (VmLifecycle.changed). */
  changed(): void;
}

const FIX: Record<NotWhole['why'], string> = {
  share:
    "threads it started past its share of the helper's fds are not counted, until it ends: raise --max-vm-threads (one VM) or the open-file limit (LimitNOFILE=, every share)",
  fds: 'the helper is out of file descriptors: raise its open-file limit (LimitNOFILE=, ulimit -n); sampled whole again once fds are free',
};

/** After each sample, before its updates go out. */
export function checkWhole(p: WholeVmsParts): void {
  for (const r of p.registry.all()) {
    if (!r.live) continue;
    const nw = p.notWhole(r.pid);
    const now = nw !== null;
    if (now === (r.notWhole === true)) continue;
    r.notWhole = now;
    p.changed();
    if (nw !== null)
      p.limiter.warn(
        'VM not sampled whole',
        { vmId: r.vmId, vm: { name: r.name, pid: r.pid, uid: r.uid }, threads: nw.threads, sampled: nw.sampled, why: nw.why },
        `VM not sampled whole: ${nw.sampled} of its ${nw.threads} threads are sampled, the others go to the host's unattributed energy; ${FIX[nw.why]}`,
      );
  }
}
