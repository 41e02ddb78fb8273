/** Re-executing the daemon with a bounding set of CAP_SYS_RAWIO, so every thread starts with no more. */
import fs from 'node:fs';
import { capget, capset, execve, keepAcrossExec, prctl } from '../libc.js';
import { CAP_SETGID, CAP_SETPCAP, CAP_SETUID, CAP_SYS_RAWIO, dropBoundingSet, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL } from './capabilities.js';
import { parseProcStatus } from './proc-status.js';

/**
 * Node flags the re-executed daemon starts with (measured with npm run bench, see README
 * "Performance"): a 1 MiB young generation (the daemon's garbage is small and short-lived; less
 * resident memory, no throughput lost) and one V8 platform worker instead of four (fewer threads and
 * stacks). A flag the user gave to node already is left as given.
 */
export const DAEMON_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=1', '--v8-pool-size=1'];

/** `execArgv` plus each of DAEMON_NODE_FLAGS whose flag is not in it yet. */
export function withDaemonNodeFlags(execArgv: readonly string[]): string[] {
  const given = new Set(execArgv.map((a) => a.split('=')[0]!.replace(/_/g, '-')));
  return [...DAEMON_NODE_FLAGS.filter((f) => !given.has(f.split('=')[0]!)), ...execArgv];
}

/** Set in the environment of the image re-executed by reexecWithRawioOnly, so it never loops. */
export const REEXEC_ENV = 'VMSR_HELPER_REEXEC';

/**
 * Without -u, capset cannot reach the threads Node started before the drop (V8 workers, the libuv
 * pool), so they would keep root's capabilities. Instead, before any work: clear the inheritable and
 * ambient sets, drop the bounding set to CAP_SYS_RAWIO and execve the same command. exec replaces
 * every thread, and a root process's new capabilities are capped by the bounding set, so every thread
 * of the new image starts with CAP_SYS_RAWIO alone. pid, environment, stdio and systemd's fd 3
 * survive exec. Returns (doing nothing) when not root, already re-executed, already reduced, or not
 * allowed to shrink the bounding set; the later dropPrivileges() still reports what it could do.
 */
export function reexecWithRawioOnly(
  o: { changingIds?: boolean } = {},
  argv: readonly string[] = [process.execPath, ...withDaemonNodeFlags(process.execArgv), ...process.argv.slice(1)],
): string {
  // -u/-g still need to change ids, and dropPrivileges() then drops the bounding set the rest of the
  // way; those three go in that same step, before the helper listens.
  const keep = o.changingIds ? [CAP_SYS_RAWIO, CAP_SETUID, CAP_SETGID, CAP_SETPCAP] : [CAP_SYS_RAWIO];
  const keepMask = keep.reduce((m, c) => m | (1n << BigInt(c)), 0n);
  if (process.env[REEXEC_ENV] !== undefined) {
    delete process.env[REEXEC_ENV];
    return `re-executed: every thread started with ${o.changingIds ? 'CAP_SYS_RAWIO (and CAP_SETUID/SETGID/SETPCAP for -u/-g)' : 'CAP_SYS_RAWIO alone'}`;
  }
  if (process.getuid?.() !== 0) return 'not root';
  const status = parseProcStatus(fs.readFileSync('/proc/self/status', 'utf8'));
  if ((status.capBnd & ~keepMask) === 0n && status.capInh === 0n && status.capAmb === 0n) return 'bounding set already reduced';
  const caps = capget();
  if ((caps.effective & (1n << BigInt(CAP_SETPCAP))) === 0n) return 'no CAP_SETPCAP to shrink the bounding set';
  capset({ effective: caps.effective, permitted: caps.permitted, inheritable: 0n });
  try {
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL);
  } catch {
    /* kernel without ambient capabilities */
  }
  dropBoundingSet(keep);
  // stdio, and systemd's sockets when they are ours (LISTEN_PID is kept: exec keeps the pid).
  const inherited = [0, 1, 2];
  if (process.env.LISTEN_PID === String(process.pid)) {
    const n = Number(process.env.LISTEN_FDS);
    if (Number.isInteger(n) && n > 0 && n < 64) for (let fd = 3; fd < 3 + n; fd++) inherited.push(fd);
  }
  for (const fd of inherited) {
    try {
      keepAcrossExec(fd);
    } catch {
      /* closed fd: the new image opens /dev/null in its place, as Node does for missing stdio */
    }
  }
  return execve(process.execPath, argv, { ...process.env, [REEXEC_ENV]: '1' });
}
