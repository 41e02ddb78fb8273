/**
 * Re-executing the daemon with its privileges already dropped, so every thread starts with no more.
 *
 * Linux credentials are per thread, and Node's threads (V8 workers, the libuv pool) exist before any
 * of our code runs: capset, PR_CAPBSET_DROP and NO_NEW_PRIVS on the main thread never reach them
 * (glibc broadcasts only set*id). exec replaces every thread with one that has the calling thread's
 * credentials, so everything is done on the main thread and then the same command is executed again.
 */
import { capget } from '../libc/capability-calls.js';
import { keepAcrossExec } from '../libc/fds.js';
import { execve, ignoreSignal, restoreSignalAction } from '../libc/processes.js';
import { SIGHUP_HELD_ENV } from '../sighup-hold.js';
import { CAP_SETPCAP, dropPrivileges, type DropOptions } from './capabilities.js';

/**
 * Node flags the re-executed daemon starts with (measured with npm run bench, see docs/performance.md,
 * "What changed for these figures"): a young generation of at most 4 MiB per semi-space, and one V8 platform worker
 * instead of four (fewer threads and stacks). The young generation grows to that bound only under
 * load: with 16 legacy clients (about 500 bytes of garbage per request) a 1 MiB semi-space meant
 * 90 scavenges a second of 0.2 ms, each holding every request in flight, which set the p99 (450
 * against 290 µs with 4 MiB); it costs about 7 MiB of RSS once grown. A flag the user gave to node
 * already is left as given.
 */
export const DAEMON_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=4', '--v8-pool-size=1'];

/**
 * The only Node flags the re-executed image may be given (as `--flag=value`): memory and thread
 * sizes. An allowlist, not a blocklist: a flag that starts a debugger (--inspect*, --debug*), loads
 * code (--require, --import, --loader, --experimental-loader, -r) or changes what is trusted must
 * never reach the image that holds the MSR fds and the socket, whatever the first image was given.
 */
const ALLOWED_NODE_FLAGS: readonly string[] = ['--max-semi-space-size', '--max-old-space-size', '--v8-pool-size', '--stack-size'];

function flagName(arg: string): string {
  return arg.split('=')[0]!.replace(/_/g, '-');
}

/** The allowed `--flag=value` items of `execArgv` (ALLOWED_NODE_FLAGS); everything else is dropped. */
function allowedExecArgv(execArgv: readonly string[]): string[] {
  return execArgv.filter((a) => a.includes('=') && ALLOWED_NODE_FLAGS.includes(flagName(a)));
}

/** The allowed items of `execArgv` plus each of DAEMON_NODE_FLAGS whose flag is not among them yet. */
export function withDaemonNodeFlags(execArgv: readonly string[]): string[] {
  const kept = allowedExecArgv(execArgv);
  const given = new Set(kept.map(flagName));
  return [...DAEMON_NODE_FLAGS.filter((f) => !given.has(flagName(f))), ...kept];
}

/**
 * Variables of the first image's environment passed to the re-executed one; every other is dropped
 * (an allowlist: NODE_OPTIONS would start a debugger or load code in it, NODE_PATH and HOME change
 * where modules are found). Names ending in `*` are prefixes. What the image must inherit on purpose
 * (the Inherited description, the -d channel) is added by the caller.
 */
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

/** The allowlisted variables of `env` (REEXEC_ENV_ALLOWLIST). */
export function allowedEnvironment(env: NodeJS.ProcessEnv): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) {
    if (v === undefined) continue;
    if (REEXEC_ENV_ALLOWLIST.some((a) => (a.endsWith('*') ? k.startsWith(a.slice(0, -1)) : k === a))) out[k] = v;
  }
  return out;
}

/** Set in the environment of the image re-executed by reexecDropped, so it never loops. */
const REEXEC_ENV = 'VMSR_HELPER_REEXEC';

/**
 * Whether the helper can drop every privilege by re-executing itself (reexecDropped): null when it
 * can, else why not (the in-process drop, dropPrivileges(), then does what it can). Consumes the
 * marker of an image that was re-executed already ('re-executed').
 */
export function reexecBlocker(): string | null {
  if (process.env[REEXEC_ENV] !== undefined) {
    delete process.env[REEXEC_ENV];
    return 're-executed';
  }
  if (process.getuid?.() !== 0) return 'not root';
  if ((capget().effective & (1n << BigInt(CAP_SETPCAP))) === 0n) return 'no CAP_SETPCAP to empty the bounding set';
  return null;
}

/**
 * On the main thread, dropPrivileges (capabilities.ts: the bounding set emptied, the securebits
 * locked, -g/-u, every capability set 0, NO_NEW_PRIVS), then exec: every thread of the new image has
 * CapEff = CapPrm = CapBnd = CapAmb = CapInh = 0, NoNewPrivs 1 and the asked uid/gid. `keepFds`
 * (beside stdio) survive the exec. The new image's environment is the allowlisted part of ours
 * (allowedEnvironment) plus `env`; its Node flags the allowlisted part of ours (allowedExecArgv) plus
 * DAEMON_NODE_FLAGS: no NODE_OPTIONS, --inspect, --require, --import or --loader crosses. Returns
 * only by throwing.
 */
export function reexecDropped(o: DropOptions, keepFds: readonly number[], env: Record<string, string>): never {
  dropPrivileges(o);
  return reexecInPlace(keepFds, env);
}

const SIGHUP = 1;

/**
 * execve with SIGHUP ignored across it (SIG_IGN survives execve, until Node's own start-up resets it)
 * and the new image told to hold SIGHUP from its first module (SIGHUP_HELD_ENV, os/sighup-hold.ts):
 * a SIGHUP during the exec does not end the daemon. An exec that fails puts SIGHUP's action back
 * (Node's handler) and throws.
 */
function execHoldingSighup(path: string, argv: readonly string[], env: Record<string, string>): never {
  const before = ignoreSignal(SIGHUP);
  try {
    return execve(path, argv, { ...env, [SIGHUP_HELD_ENV]: '1' });
  } catch (e) {
    restoreSignalAction(SIGHUP, before);
    throw e;
  }
}

/** The command line the daemon re-executes: node with the allowed flags, the installed script, the same arguments. */
export function daemonArgv(): string[] {
  return [process.execPath, ...withDaemonNodeFlags(process.execArgv), ...process.argv.slice(1)];
}

/**
 * A restart in place (docs/daemon.md "Restarts"): the daemon, privileges already dropped on every
 * thread, executes itself again with nothing changed about them. What it holds crosses the exec
 * unchanged: the uid, the empty bounding set, the locked securebits (no capability for uid 0 at
 * exec), NO_NEW_PRIVS. So the new image holds no capability either; the MSR fds cross as fds.
 * `keepFds` (beside stdio) survive; the environment is the allowlisted part of ours plus `env`.
 * Returns only by throwing (then the fds are still kept across exec: see undoKeepAcrossExec).
 */
export function reexecInPlace(keepFds: readonly number[], env: Record<string, string>, argv: readonly string[] = daemonArgv()): never {
  for (const fd of new Set([0, 1, 2, ...keepFds])) {
    try {
      keepAcrossExec(fd);
    } catch {
      /* closed fd: the new image opens /dev/null in its place, as Node does for missing stdio */
    }
  }
  // Built from allowlists, never `...process.env`: see REEXEC_ENV_ALLOWLIST.
  return execHoldingSighup(argv[0]!, argv, { ...allowedEnvironment(process.env), ...env, [REEXEC_ENV]: '1' });
}
