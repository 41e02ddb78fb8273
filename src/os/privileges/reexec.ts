/**
 * Re-executing the daemon with its privileges dropped: credentials are per thread, Node's threads exist before our code, and
 * capset, PR_CAPBSET_DROP and NO_NEW_PRIVS never reach them (glibc broadcasts only set*id). exec leaves one thread with the
 * caller's credentials, so the main thread drops, then the command is executed again.
 */
import { capget } from '../libc/capability-calls.js';
import { setCloexec } from '../libc/fds.js';
import { execve, ignoreSignal, restoreSignalAction } from '../libc/processes.js';
import { SIGHUP_HELD_ENV } from '../sighup-hold.js';
import { CAP_SETPCAP } from './capabilities.js';

/** Node flags the re-executed daemon starts with unless given them already (docs/performance.md). */
export const DAEMON_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=4', '--v8-pool-size=1'];

/**
 * The only Node flags (`--flag=value`) the re-executed image may get: a flag that starts a debugger, loads code (--require,
 * --import, --loader) or changes what is trusted must never reach the image holding the MSR fds and the socket.
 */
const ALLOWED_NODE_FLAGS: readonly string[] = ['--max-semi-space-size', '--max-old-space-size', '--v8-pool-size', '--stack-size'];

function flagName(arg: string): string {
  return arg.split('=')[0]!.replace(/_/g, '-');
}

/** The allowed items of `execArgv` plus each of DAEMON_NODE_FLAGS whose flag is not among them yet. */
export function withDaemonNodeFlags(execArgv: readonly string[]): string[] {
  const kept = execArgv.filter((a) => a.includes('=') && ALLOWED_NODE_FLAGS.includes(flagName(a)));
  const given = new Set(kept.map(flagName));
  return [...DAEMON_NODE_FLAGS.filter((f) => !given.has(flagName(f))), ...kept];
}

/** The re-executed image's variables (`*`: a prefix); not NODE_OPTIONS (loads code), NODE_PATH or HOME (move modules). */
const REEXEC_ENV_ALLOWLIST: readonly string[] = [
  'PATH',
  'LANG',
  'LANGUAGE',
  'LC_*',
  'TZ',
  'TERM',
  'NO_COLOR',
  // systemd: the notify socket and watchdog (helper/lifecycle/systemd.ts), the journal (logging).
  'NOTIFY_SOCKET',
  'WATCHDOG_USEC',
  'WATCHDOG_PID',
  'JOURNAL_STREAM',
  // systemd 254+: the unit's FileDescriptorStoreMax= (0: no fd store; helper/handover/restarter.ts).
  'FDSTORE',
  'INVOCATION_ID',
  // The keeper's channel (an fd number) and its account of the crash before (keeper/keeper-messages.ts KEEPER_ENV).
  'VMSR_HELPER_KEEPER',
  'VMSR_HELPER_KEEPER_NOTE',
  // Test hook: the restore crashes on a checkpoint with a VM of this pid (helper/handover/kept.ts).
  'VMSR_HELPER_TEST_CRASH_ON_VM_PID',
];

export function allowedEnvironment(env: NodeJS.ProcessEnv): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) {
    if (v === undefined) continue;
    if (REEXEC_ENV_ALLOWLIST.some((a) => (a.endsWith('*') ? k.startsWith(a.slice(0, -1)) : k === a))) out[k] = v;
  }
  return out;
}

/** Set in the environment of the image re-executed by reexecInPlace, so it never loops. */
const REEXEC_ENV = 'VMSR_HELPER_REEXEC';

/** Null when the helper can drop every privilege by re-executing itself, else why not ('re-executed': the marker, consumed). */
export function reexecBlocker(): string | null {
  if (process.env[REEXEC_ENV] !== undefined) {
    delete process.env[REEXEC_ENV];
    return 're-executed';
  }
  if (process.getuid?.() !== 0) return 'not root';
  if ((capget().effective & (1n << BigInt(CAP_SETPCAP))) === 0n) return 'no CAP_SETPCAP to empty the bounding set';
  return null;
}

const SIGHUP = 1;

export function daemonArgv(): string[] {
  return [process.execPath, ...withDaemonNodeFlags(process.execArgv), ...process.argv.slice(1)];
}

/**
 * A restart in place (docs/daemon.md "Restarts"): uid, empty bounding set, locked securebits and NO_NEW_PRIVS cross the exec
 * (no capability in the new image). `keepFds` and stdio survive (a failed exec closes-on-exec `keepFds` again); env and Node flags: our allowlisted ones, plus `env`.
 */
export function reexecInPlace(keepFds: readonly number[], env: Record<string, string>, argv: readonly string[] = daemonArgv()): never {
  // A closed fd: the new image opens /dev/null in its place, as Node does for missing stdio.
  const cloexec = (fds: Iterable<number>, on: boolean) => {
    for (const fd of fds) {
      try {
        setCloexec(fd, on);
      } catch {
        /* closed */
      }
    }
  };
  cloexec(new Set([0, 1, 2, ...keepFds]), false);
  // SIGHUP ignored across the exec (until Node's start-up resets it), then held by the new image's first module
  // (os/sighup-hold.ts): a SIGHUP meanwhile does not end the daemon. The environment: allowlists, never `...process.env`.
  const before = ignoreSignal(SIGHUP);
  try {
    return execve(argv[0]!, argv, { ...allowedEnvironment(process.env), ...env, [REEXEC_ENV]: '1', [SIGHUP_HELD_ENV]: '1' });
  } catch (e) {
    restoreSignalAction(SIGHUP, before);
    cloexec(
      keepFds.filter((fd) => fd > 2),
      true,
    );
    throw e;
  }
}
