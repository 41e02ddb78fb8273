/**
 * THE advice of a refusal for want of the observer group (HOST_SUBSCRIBE, the host's STATS_FD): which
 * group to join, by name (what `usermod -aG` and a unit's SupplementaryGroups= take) and gid, or how
 * to make one. The name is looked up in the group database once per gid and kept (a client may be
 * refused at every retry; /etc/group is not read each time).
 */
import { groupNameOf } from '../../../os/privileges/accounts.js';

let cached: { gid: number; name: string | undefined } | null = null;

export function observerGroupAdvice(gid: number | undefined, lookup: (gid: number) => string | undefined = groupNameOf): string {
  if (gid === undefined) return 'start the helper with --observer-group GROUP and add this user to it';
  if (cached === null || cached.gid !== gid) cached = { gid, name: lookup(gid) };
  const group = cached.name === undefined ? `gid ${gid}` : `'${cached.name}' (gid ${gid})`;
  return `add this user to the helper's --observer-group, group ${group}`;
}
