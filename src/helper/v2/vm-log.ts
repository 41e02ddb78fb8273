/** How log lines name a VM (`vm: {...}`: top-level `pid` and `name` are pino's), and how often: what any user causes is rate-limited. */
import { formatUuid } from '../../common/uuid.js';

/** Lines of one kind ("VM discovered", "VM ended", ...) logged per window before they are counted instead (the service flushes the counts at close). */
export const VM_LOG_BURST = 20;

export function vmLogFields(vm: { name: string | null; uuid: Uint8Array | null; pid: number; uid: number }) {
  return { name: vm.name, uuid: vm.uuid === null ? null : formatUuid(vm.uuid), pid: vm.pid, uid: vm.uid };
}
