/**
 * How the daemon's log lines name a VM, and how often they may. A VM is `vm: { name, uuid, pid, uid }`
 * (name and UUID from its command line, as `virsh list` and `virsh domuuid` show them), never
 * top-level `pid` or `name`: those are pino's own (the daemon's pid, the logger's name), so `jq .pid`
 * is always the daemon's. Lines any local user can cause by starting processes that look like QEMU
 * ("VM discovered", "VM ended", "VM discovered but not sampled") go through a LogLimiter:
 * VM_LOG_BURST lines per kind per window (DEFAULT_LOG_WINDOW_MS), then a count when the window ends
 * or the daemon stops.
 */
import type { Logger } from 'pino';
import { formatUuid } from '../../common/uuid.js';
import { LogLimiter } from '../../logging/log-limiter.js';

/** Lines of one kind ("VM discovered", "VM ended", ...) logged per window before they are counted instead. */
export const VM_LOG_BURST = 20;

/** What a log line says of a VM. */
interface VmLogFields {
  name: string | null;
  uuid: string | null;
  pid: number;
  uid: number;
}

export function vmLogFields(vm: { name: string | null; uuid: Uint8Array | null; pid: number; uid: number }): VmLogFields {
  return { name: vm.name, uuid: vm.uuid === null ? null : formatUuid(vm.uuid), pid: vm.pid, uid: vm.uid };
}

/** The limiter of the VM lifecycle lines (flush() it at shutdown, so no count is lost). */
export function vmLogLimiter(log: Logger): LogLimiter {
  return new LogLimiter(log, { burst: VM_LOG_BURST });
}
