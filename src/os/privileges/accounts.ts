/** Users and groups given as names (looked up in passwd/group) or numbers, like qemu-vmsr-helper's -u/-g. */
import fs from 'node:fs';

/** A user or group given as a name (looked up in `db`, passwd or group) or a number, like qemu-vmsr-helper's -u and -g. */
export function resolveId(spec: string, what: 'user' | 'group', db = readOr(what === 'user' ? '/etc/passwd' : '/etc/group')): number {
  const fix = what === 'user' ? 'give an existing user name or a numeric uid' : 'give an existing group name or a numeric gid';
  if (spec === '') throw new Error(`invalid ${what} '': ${fix}`);
  for (const line of db.split('\n')) {
    const f = line.split(':');
    if (f[0] === spec && f[2] !== undefined && /^\d+$/.test(f[2])) return Number(f[2]);
  }
  if (/^\d+$/.test(spec) && Number(spec) <= 0xfffffffe) return Number(spec);
  throw new Error(`invalid ${what} '${spec}': ${fix}`);
}

/** The primary group of a uid in passwd, used when -u is given without -g; undefined if unknown. */
export function primaryGroupOf(uid: number, passwd = readOr('/etc/passwd')): number | undefined {
  for (const line of passwd.split('\n')) {
    const f = line.split(':');
    if (f[2] === String(uid) && f[3] !== undefined && /^\d+$/.test(f[3])) return Number(f[3]);
  }
  return undefined;
}

/** The name of a gid in the group database (its first entry), undefined when it has none. */
export function groupNameOf(gid: number, group = readOr('/etc/group')): string | undefined {
  for (const line of group.split('\n')) {
    const f = line.split(':');
    if (f[2] === String(gid) && f[0] !== undefined && f[0] !== '') return f[0];
  }
  return undefined;
}

function readOr(file: string): string {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}
