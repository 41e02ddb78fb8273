/**
 * STATS_FD: a read-only fd of a VM's statistics file (or, for id 0, the host's), in SCM_RIGHTS with
 * the reply (docs/stats-fd.md). Who may have a VM's is who may see it (OBSERVE's rule, the same
 * ERROR 3 for a VM the peer may not see as for none); the host's follows HOST_SUBSCRIBE (ERROR 2).
 */
import { cannot } from '../../../common/errors.js';
import { closeFd } from '../../../os/libc/fds.js';
import { groupNameOf } from '../../../os/privileges/accounts.js';
import { E, T, encodeStatsFdReply } from '../../../protocol/v2/codec.js';
import { refusal } from '../reply.js';
import type { Handler } from './handler.js';

let cached: { gid: number; name: string | undefined } | null = null;

/**
 * THE advice of a refusal for want of the observer group: the group by name (what `usermod -aG` takes) and
 * gid, or how to make one. The name is looked up once per gid (a client may be refused at every retry).
 */
export function observerGroupAdvice(gid: number | undefined): string {
  if (gid === undefined) return 'start the helper with --observer-group GROUP and add this user to it';
  if (cached === null || cached.gid !== gid) cached = { gid, name: groupNameOf(gid) };
  const group = cached.name === undefined ? `gid ${gid}` : `'${cached.name}' (gid ${gid})`;
  return `add this user to the helper's --observer-group, group ${group}`;
}

export const statsFd: Handler<typeof T.STATS_FD> = (req, conn, p) => {
  const refuse = (code: number, message: string) => refusal(code, T.STATS_FD, message);
  const viewer = p.clients.viewerOf(conn);
  if (req.vmId === 0 && !viewer.seesAll) {
    const how = observerGroupAdvice(p.observerGid);
    return refuse(E.NOT_PERMITTED, `the host's statistics are for root and the observer group; ${how}`);
  }
  if (req.vmId !== 0 && !p.registry.canSee(viewer, req.vmId)) return refuse(E.NO_SUCH, `no VM ${req.vmId}`);
  const what = req.vmId === 0 ? "the host's statistics file" : `the statistics file of VM ${req.vmId}`;
  const room = p.stats.canHandOut(what);
  if (!room.ok) return refuse(room.error.code, room.error.message);
  const file = req.vmId === 0 ? p.stats.hostFile() : p.stats.vm(req.vmId);
  if (!file.ok) return refuse(file.error.code, file.error.message);
  let fd: number;
  try {
    fd = file.value.openReadOnly();
  } catch (e) {
    return refuse(
      E.LIMIT,
      cannot(`hand out ${what}`, (e as Error).message, "raise the helper's open-file limit (LimitNOFILE=, ulimit -n)"),
    );
  }
  return { frame: encodeStatsFdReply(req.vmId, file.value.size), fds: [fd], release: () => closeFd(fd) };
};
