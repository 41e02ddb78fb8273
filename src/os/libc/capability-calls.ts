/** Capabilities and ids: capget/capset, prctl, setresuid/setresgid/setgroups. */
import { errnoError, libc } from './errno.js';

const fn = {
  capget: libc.func('int capget(void *hdr, void *data)'),
  capset: libc.func('int capset(void *hdr, void *data)'),
  prctl: libc.func('int prctl(int option, unsigned long arg2, unsigned long arg3, unsigned long arg4, unsigned long arg5)'),
  setresuid: libc.func('int setresuid(uint32_t ruid, uint32_t euid, uint32_t suid)'),
  setresgid: libc.func('int setresgid(uint32_t rgid, uint32_t egid, uint32_t sgid)'),
  setgroups: libc.func('int setgroups(size_t size, void *list)'),
};

export const PR_CAPBSET_DROP = 24;
export const PR_SET_NO_NEW_PRIVS = 38;
const LINUX_CAPABILITY_VERSION_3 = 0x20080522;

/** Capability sets of the calling thread as 64-bit masks. */
interface CapabilitySets {
  effective: bigint;
  permitted: bigint;
  inheritable: bigint;
}

function capHeader(): Buffer {
  const hdr = Buffer.alloc(8);
  hdr.writeUInt32LE(LINUX_CAPABILITY_VERSION_3, 0);
  hdr.writeInt32LE(0, 4);
  return hdr;
}

export function capget(): CapabilitySets {
  const data = Buffer.alloc(24);
  if (fn.capget(capHeader(), data) !== 0) throw errnoError('capget');
  const join = (lo: number, hi: number) => (BigInt(data.readUInt32LE(hi)) << 32n) | BigInt(data.readUInt32LE(lo));
  return { effective: join(0, 12), permitted: join(4, 16), inheritable: join(8, 20) };
}

/** capset for the calling thread only: Linux capabilities are per thread. */
export function capset(sets: CapabilitySets): void {
  const data = Buffer.alloc(24);
  [sets.effective, sets.permitted, sets.inheritable].forEach((v, i) => {
    data.writeUInt32LE(Number(v & 0xffffffffn), 4 * i);
    data.writeUInt32LE(Number((v >> 32n) & 0xffffffffn), 12 + 4 * i);
  });
  if (fn.capset(capHeader(), data) !== 0) throw errnoError('capset');
}

export function prctl(option: number, arg2 = 0, arg3 = 0, arg4 = 0, arg5 = 0): number {
  const r = fn.prctl(option, arg2, arg3, arg4, arg5) as number;
  if (r < 0) throw errnoError(`prctl(${option})`);
  return r;
}

/** glibc broadcasts set*id to every thread of the process, so these change the whole process. */
export function setresuid(uid: number, realAndSaved = uid): void {
  if (fn.setresuid(realAndSaved, uid, realAndSaved) !== 0) throw errnoError(`setresuid(${realAndSaved}, ${uid}, ${realAndSaved})`);
}

export function setresgid(gid: number): void {
  if (fn.setresgid(gid, gid, gid) !== 0) throw errnoError(`setresgid(${gid})`);
}

export function setgroups(gids: readonly number[]): void {
  const list = Buffer.alloc(Math.max(4, gids.length * 4));
  gids.forEach((g, i) => list.writeUInt32LE(g, i * 4));
  if (fn.setgroups(gids.length, list) !== 0) throw errnoError('setgroups');
}
