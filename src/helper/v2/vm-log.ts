/** How log lines name a VM (`vm: {...}`: top-level `pid` and `name` are pino's), and how often: what any user causes is rate-limited. */
import type { Logger } from 'pino';
import { formatUuid } from '../../common/uuid.js';
import { LogLimiter } from '../../logging/log-limiter.js';

/** Lines of one kind ("VM discovered", "VM ended", ...) logged per window before they are counted instead. */
export const VM_LOG_BURST = 20;

export function vmLogFields(vm: { name: string | null; uuid: Uint8Array | null; pid: number; uid: number }) {
  return { name: vm.name, uuid: vm.uuid === null ? null : formatUuid(vm.uuid), pid: vm.pid, uid: vm.uid };
}

/** The limiter of the VM lifecycle lines (flush() it at shutdown, so no count is lost). */
export function vmLogLimiter(log: Logger): LogLimiter {
  return new LogLimiter(log, VM_LOG_BURST);
}
