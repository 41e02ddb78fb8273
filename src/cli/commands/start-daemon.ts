/** The root command: qemu-vmsr-helper's options (-k -f -d -u -g -v -q -T) plus ours; parseDaemonOptions is pure. */
import fs from 'node:fs';
import path from 'node:path';
import { Option, type Command } from 'commander';
import { DEFAULT_HELPER_SOCKET } from '../../protocol/socket-path.js';
import { DEFAULT_AMD_SYNTH } from '../../msr/legacy-registers.js';
import { createLogger, levelFromFlags, type Logger } from '../../logging/logger.js';
import { ReportedError } from '../cli-errors.js';
import { reexecBlocker } from '../../os/privileges/reexec.js';
import {
  checkSocketDirectory,
  checkSocketPathLength,
  DEFAULT_BUSY_POLL_MAX_US,
  DEFAULT_INCOMPLETE_LIMITS,
  DEFAULT_MAX_CONNECTIONS,
  MAX_BUSY_POLL_US,
  DEFAULT_SOCKET_MODE,
} from '../../helper/server/listener.js';
import { primaryGroupOf, resolveId } from '../../os/privileges/accounts.js';
import type { DaemonConfig } from '../../helper/lifecycle/config.js';
import {
  addHostOptions,
  addLogLevelOptions,
  addV2Options,
  collect,
  flagged,
  energySourceOption,
  hostOptionsFrom,
  parseSocketMode,
  wholeNumberArg,
  secondsArg,
  v2OptionsFrom,
  type RawHostOptions,
  type V2CliOptions,
} from '../options.js';
import { cannot } from '../../common/errors.js';
import { KEEPER_ENV, NO_KEEPER_ENV } from '../../keeper/keeper-messages.js';
import { endWithKeeper } from '../../keeper/link.js';
import { DEFAULT_ENERGY_SOURCE, type EnergySourceChoice } from '../../energy/kinds.js';

const DEFAULT_PIDFILE = '/run/qemu-vmsr-helper.pid';
/** Where -d logs without --log-file: a detached daemon has no terminal, and without systemd no journal. */
export const DEFAULT_DAEMON_LOG_FILE = '/var/log/qemu-vmsr-helper.log';

interface RawDaemonOptions extends RawHostOptions {
  energySource?: EnergySourceChoice;
  /** --guest-energy (a v2 option; the start-up holds QEMU's answers for it too). */
  guestEnergy?: string;
  socket?: string;
  pidfile?: string;
  daemon?: boolean;
  user?: string;
  group?: string;
  verbose?: boolean;
  quiet?: boolean;
  trace?: string[];
  amdPowerLimit?: string;
  amdTdp?: string;
  maxConnections?: number;
  frameTimeout?: number;
  busyPollMaxUs?: number;
  socketMode?: string;
  socketGroup?: string;
  logFile?: string;
  /** --keeper (true), --no-keeper or VMSR_HELPER_NO_KEEPER (false), neither (undefined: the keeper, outside systemd). */
  keeper?: boolean;
}

export interface IdLookups {
  user(spec: string): number;
  group(spec: string): number;
  primaryGroup(uid: number): number | undefined;
}

const systemIds: IdLookups = { user: (s) => resolveId(s, 'user'), group: (s) => resolveId(s, 'group'), primaryGroup: primaryGroupOf };

/** -T as QEMU spells it: [[enable=]PATTERN][,events=FILE] (patterns one a line); file= is refused: logs go to stderr. */
export function parseTraceOption(value: string, readFile: (f: string) => string): string[] {
  const out: string[] = [];
  for (const part of value.split(',')) {
    if (part === '') continue;
    const eq = part.indexOf('=');
    const key = eq < 0 ? 'enable' : part.slice(0, eq);
    const val = eq < 0 ? part : part.slice(eq + 1);
    if (key === 'enable') {
      if (val === '') throw new Error("-T/--trace: empty pattern; use e.g. -T legacy or -T 'enable=*'");
      out.push(val);
    } else if (key === 'events') {
      let text: string;
      try {
        text = readFile(val);
      } catch (e) {
        throw new Error(`-T/--trace: cannot read events file ${val}: ${(e as Error).message}`);
      }
      for (const line of text.split('\n')) {
        const t = line.trim();
        if (t !== '' && !t.startsWith('#')) out.push(t);
      }
    } else if (key === 'file') {
      throw new Error('-T/--trace: file= is not supported; trace output goes to the log (stderr, or --log-file FILE)');
    } else {
      throw new Error(`-T/--trace: unknown key '${key}'; use [[enable=]PATTERN][,events=FILE]`);
    }
  }
  return out;
}

function parseWatts(v: string | undefined, flag: string, dflt: number): number {
  if (v === undefined) return dflt;
  if (!/^\d+(\.\d+)?$/.test(v) || Number(v) <= 0 || Number(v) > 4000) {
    throw new Error(`${flag}: expected watts between 0 and 4000, like 120 or 95.5 (got '${v}')`);
  }
  return Number(v);
}

export function parseDaemonOptions(
  raw: RawDaemonOptions,
  ids: IdLookups = systemIds,
  readFile: (f: string) => string = (f) => fs.readFileSync(f, 'utf8'),
): DaemonConfig {
  if (raw.socket !== undefined) {
    if (!raw.socket.startsWith('/'))
      throw new Error(`-k/--socket: socket path must be absolute (got '${raw.socket}'); e.g. -k /run/qemu-vmsr-helper.sock`);
    checkSocketPathLength(raw.socket);
    checkSocketDirectory(raw.socket);
  }
  if (raw.pidfile === '') throw new Error('-f/--pidfile: empty path; e.g. -f /run/qemu-vmsr-helper.pid');
  const { paths: hostPaths, vendor } = hostOptionsFrom(raw);
  const uid = raw.user === undefined ? undefined : ids.user(raw.user);
  let gid = raw.group === undefined ? undefined : ids.group(raw.group);
  if (gid === undefined && uid !== undefined) gid = ids.primaryGroup(uid);
  return {
    socketPath: raw.socket ?? DEFAULT_HELPER_SOCKET,
    socketPathGiven: raw.socket !== undefined,
    pidfile: path.resolve(raw.pidfile ?? DEFAULT_PIDFILE),
    pidfileGiven: raw.pidfile !== undefined,
    daemonize: raw.daemon === true,
    uid,
    gid,
    logLevel: levelFromFlags(raw),
    traceAreas: (raw.trace ?? []).flatMap((t) => parseTraceOption(t, readFile)),
    hostPaths,
    vendor,
    energySource: raw.energySource ?? DEFAULT_ENERGY_SOURCE,
    maxConnections: raw.maxConnections ?? DEFAULT_MAX_CONNECTIONS,
    socketMode: raw.socketMode === undefined ? DEFAULT_SOCKET_MODE : parseSocketMode(raw.socketMode),
    socketGid: raw.socketGroup === undefined ? undefined : flagged('--socket-group', () => ids.group(raw.socketGroup!)),
    frameTimeoutMs: Math.round((raw.frameTimeout ?? DEFAULT_INCOMPLETE_LIMITS.deadlineMs / 1000) * 1000),
    busyPollMaxUs: raw.busyPollMaxUs ?? DEFAULT_BUSY_POLL_MAX_US,
    holdEnergyStatus: raw.guestEnergy === 'exact',
    amd: {
      powerLimitWatts: parseWatts(raw.amdPowerLimit, '--amd-power-limit', DEFAULT_AMD_SYNTH.powerLimitWatts),
      tdpWatts: parseWatts(raw.amdTdp, '--amd-tdp', DEFAULT_AMD_SYNTH.tdpWatts),
    },
  };
}

/** The file the daemon logs to: --log-file, or with -d DEFAULT_DAEMON_LOG_FILE; none: stderr. Absolute (-d runs in /). */
export function logFileFrom(raw: Pick<RawDaemonOptions, 'logFile' | 'daemon'>): string | undefined {
  if (raw.logFile === '') throw new Error(`--log-file: empty path; e.g. --log-file ${DEFAULT_DAEMON_LOG_FILE}`);
  if (raw.logFile !== undefined) return path.resolve(raw.logFile);
  return raw.daemon === true ? DEFAULT_DAEMON_LOG_FILE : undefined;
}

/** -d: re-spawn detached; else run (as root: privileged steps, then a re-exec without privileges); lazy imports keep the first image small. */
async function startDaemonFromCli(
  config: DaemonConfig,
  v2: ReturnType<typeof v2OptionsFrom>,
  logger: () => Logger,
  logFile?: string,
  keeper?: boolean,
): Promise<void> {
  // One round of loading: privileged-start's modules are the daemon's too (a non-root start loads them after).
  const [{ isDaemonChild, reportFailure, spawnDetached }, { takeInherited }, { startPrivileged }] = await Promise.all([
    import('../../helper/lifecycle/daemonize.js'),
    import('../../helper/handover/inherited.js'),
    import('../../helper/lifecycle/privileged-start.js'),
  ]);
  let inherited;
  try {
    inherited = takeInherited();
  } catch (e) {
    if (isDaemonChild()) await reportFailure((e as Error).message);
    throw e;
  }
  // An image that inherits from an earlier one (the start-up re-exec, a restart in place) is the
  // background daemon already: only the first -d image detaches (with --keeper, the keeper does).
  if (config.daemonize && !isDaemonChild() && inherited === null && process.env[KEEPER_ENV.channel] === undefined) {
    await spawnDetached(process.argv);
    return;
  }
  if (isDaemonChild()) process.chdir('/');
  try {
    // The first image opens the log file, as root, before anything logs; later images (the keeper,
    // the start-up re-exec, a restart in place) have it as their stderr already (os/log-file.ts).
    if (inherited === null && logFile !== undefined) (await import('../../os/log-file.js')).redirectStderrToFile(logFile);
    const blocker = reexecBlocker();
    // --record is created before the privilege drop, like the socket: -u's user need not own its directory.
    const files = v2.recordPath !== undefined ? [v2.recordPath] : [];
    // Outside systemd the keeper's child serves, unless --no-keeper (docs/daemon.md "Crashes"). Only the
    // first image runs the privileged steps and re-executes itself.
    const keeps = keeper !== false && inherited === null && keeperWanted(keeper === true, logger);
    if (inherited === null && (blocker === null || keeps))
      await startPrivileged(config, files, keeps ? { level: config.logLevel } : undefined);
    if (process.env[KEEPER_ENV.channel] !== undefined && !endWithKeeper()) {
      logger().warn({}, 'the keeper that started this process is gone: stopping (nothing is left behind)');
      return;
    }
    const { runDaemon } = await import('../../helper/daemon.js');
    await runDaemon(config, { v2, files, reexec: blocker ?? 're-executed', ...(inherited ? { inherited } : {}), logger: logger() });
  } catch (e) {
    if (isDaemonChild()) await reportFailure((e as Error).message);
    throw e;
  }
}

/** Whether the first image starts a keeper: not under systemd, whose fd store does its work (`asked`: --keeper, then said). */
function keeperWanted(asked: boolean, logger: () => Logger): boolean {
  if (process.env.NOTIFY_SOCKET === undefined && process.env.LISTEN_FDS === undefined) return true;
  if (asked)
    logger()
      .child({ area: 'keeper' })
      .warn(
        {},
        '--keeper under systemd: not needed (the fd store holds the connections, Restart= starts the helper again); running without it',
      );
  return false;
}

export function configureDaemonCommand(program: Command): void {
  program
    .description('Virtual RAPL MSR helper for QEMU (drop-in qemu-vmsr-helper): serves rapl-helper-socket clients')
    .option('-k, --socket <path>', `path to the unix socket (default '${DEFAULT_HELPER_SOCKET}')`)
    .option('-f, --pidfile <path>', `PID file, written with -d or when given (default '${DEFAULT_PIDFILE}')`)
    .option('-d, --daemon', `run in the background (logs to --log-file, default '${DEFAULT_DAEMON_LOG_FILE}')`)
    .option('--log-file <path>', 'append the log to this file (JSON lines) instead of stderr; opened as root before the privilege drop')
    .option(
      '--keeper',
      'the default without systemd: a small keeper process holds the socket, every QEMU connection and the latest checkpoint, and starts the helper again when it crashes',
    )
    .addOption(
      new Option('--no-keeper', 'run without the keeper: the process started serves, and a crash loses the connections and the state').env(
        NO_KEEPER_ENV,
      ),
    )
    .option('-u, --user <user>', 'user (name or uid) to drop privileges to')
    .option('-g, --group <group>', "group (name or gid) to drop privileges to (default: the user's primary group)");
  addLogLevelOptions(program).option(
    '-T, --trace <spec>',
    '[[enable=]PATTERN][,events=FILE]: debug logging for areas matching PATTERN (legacy, server, privileges, systemd, v2; * wildcard)',
    collect(String),
  );
  addHostOptions(program)
    .addOption(energySourceOption())
    .option('--amd-power-limit <watts>', `AMD: package power limit reported as MSR 0x610 (default ${DEFAULT_AMD_SYNTH.powerLimitWatts})`)
    .option('--amd-tdp <watts>', `AMD: thermal design power reported as MSR 0x614 (default ${DEFAULT_AMD_SYNTH.tdpWatts})`)
    .option(
      '--socket-mode <mode>',
      'permission bits of the socket file, octal, whatever the umask (default 0600; e.g. 0660 with --socket-group)',
    )
    .option(
      '--socket-group <group>',
      "group (name or gid) of the socket file, e.g. the group QEMU runs as (libvirt: 'libvirt-qemu' or 'kvm')",
    )
    .addOption(
      new Option(
        '--max-connections <n>',
        `connections served at once; more are closed at once (default ${DEFAULT_MAX_CONNECTIONS}, lowered to fit the open-file limit)`,
      ).argParser(wholeNumberArg('--max-connections', 1 << 20)),
    )
    .addOption(
      new Option(
        '--frame-timeout <seconds>',
        `a request or frame must arrive whole within this time of its first byte, or the connection is closed (default ${DEFAULT_INCOMPLETE_LIMITS.deadlineMs / 1000})`,
      ).argParser(secondsArg('--frame-timeout', { min: 0.1, max: 3600 })),
    )
    .addOption(
      new Option(
        '--busy-poll-max-us <us>',
        `after replies, wait for a client asking again within this many microseconds by polling, not sleeping, as QEMU's poll-max-ns (0: never; default ${DEFAULT_BUSY_POLL_MAX_US})`,
      ).argParser(wholeNumberArg('--busy-poll-max-us', MAX_BUSY_POLL_US, 0)),
    )
    .action(async (raw: RawDaemonOptions & V2CliOptions) => {
      // One logger from the first line on, so a start-up error is logged like everything after it;
      // made on first use, so the first image (which re-executes itself) loads pino only for an error.
      let logger: Logger | undefined;
      const log = (): Logger => (logger ??= createLogger(levelFromFlags(raw)));
      try {
        await startDaemonFromCli(parseDaemonOptions(raw), v2OptionsFrom(raw), log, logFileFrom(raw), raw.keeper);
      } catch (e) {
        log().fatal(cannot(`start`, (e as Error).message));
        throw new ReportedError((e as Error).message);
      }
    });
  addV2Options(program);
}
