/**
 * THE rule from what a user types (`watch nbvm1`) to one listed VM: a PID, a UUID or a name, in that order of trust (anyone
 * can copy a name or UUID, no one a live pid); a live VM wins over an ended one; several left: an error listing them.
 */
import { cannotError } from '../common/errors.js';
import type { VmInfo } from './v2-replies.js';

/** Candidates an ambiguity error lists; the rest are counted. */
export const MAX_CANDIDATES_SHOWN = 10;
/** Names a "no such VM" error lists of the VMs the helper does show; the rest are counted. */
export const MAX_NAMES_SHOWN = 10;

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** A VM as the user reads it in messages: its name (quoted: names are hostile text), pid, owner, uuid. */
export function describeVm(vm: VmInfo): string {
  const name = vm.name === null ? '(unnamed)' : JSON.stringify(vm.name);
  return `${name} pid ${vm.pid} uid ${vm.uid} uuid ${vm.uuid ?? '(none)'} ${vm.source}${vm.ended ? ', ended' : ''}`;
}

/** The one VM `target` names (see the module's rule); else throws naming the candidates or the VMs there are, and how to pick with `command`. */
export function findVm(vms: readonly VmInfo[], target: string, command: string): VmInfo {
  const what = `find the VM ${JSON.stringify(target)}`;
  let matched: VmInfo[] = [];
  if (/^\d{1,10}$/.test(target)) matched = vms.filter((v) => v.pid === Number(target));
  if (matched.length === 0 && UUID_RE.test(target)) matched = vms.filter((v) => v.uuid === target.toLowerCase());
  if (matched.length === 0) matched = vms.filter((v) => v.name === target);
  const live = matched.filter((v) => !v.ended);
  const found = live.length > 0 ? live : matched;
  if (found.length === 1) return found[0]!;
  if (found.length === 0) {
    const named = vms.filter((v) => !v.ended).map((v) => (v.name === null ? `pid ${v.pid}` : JSON.stringify(v.name)));
    const shown = named.slice(0, MAX_NAMES_SHOWN).join(', ');
    const more = named.length > MAX_NAMES_SHOWN ? ` and ${named.length - MAX_NAMES_SHOWN} more` : '';
    const there = named.length === 0 ? 'the helper lists no VM you may see' : `the VMs you may see are ${shown}${more}`;
    throw cannotError(
      what,
      `no VM has that pid, UUID or name (${there})`,
      "give a name as 'virsh list' shows it, a UUID or a pid; you see only your own VMs unless you are root or in the helper's --observer-group, and only what its discovery finds (not with --no-discovery)",
    );
  }
  const lines = found.slice(0, MAX_CANDIDATES_SHOWN).map((v) => `\n  ${describeVm(v)}`);
  const more = found.length > MAX_CANDIDATES_SHOWN ? `\n  and ${found.length - MAX_CANDIDATES_SHOWN} more` : '';
  const uuids = new Set(found.map((v) => v.uuid));
  const byUuid = uuids.size === found.length && !uuids.has(null) ? ` or its UUID (${command} ${found[0]!.uuid})` : '';
  // The candidates last, one a line, after the fix: the message's first line reads whole.
  throw cannotError(
    what,
    `${found.length} VMs match`,
    `pick one by its PID (${command} ${found[0]!.pid})${byUuid}; a process that is not your VM can wear its name and UUID, never its PID:${lines.join('')}${more}`,
  );
}
