/** THE option set of the commands and the argument parsers; each refuses bad text naming the flag. */
import path from 'node:path';
import { InvalidArgumentError, Option, type Command } from 'commander';
import { DEFAULT_GUEST_DIR } from '../guest-dir/defaults.js';
import { DEFAULT_HOST_PATHS, validateMsrPathTemplate, type HostPaths } from '../msr/host-paths.js';
import type { VendorChoice } from '../helper/lifecycle/startup-checks.js';
import { UsageError } from './cli-errors.js';
import { DEFAULT_V2_LIMITS } from '../helper/v2/v2-limits.js';
import type { V2DaemonSettings } from '../helper/assemble.js';
import { resolveId } from '../os/privileges/accounts.js';
import { DEFAULT_MAX_VM_THREADS, MAX_TID, MAX_VCPUS, type VcpuSpec, parseVcpuList } from '../model/vcpus.js';
import { DEFAULT_HELPER_SOCKET } from '../protocol/socket-path.js';
import { parseListenAddress, type ListenAddress } from '../exporter/listen-address.js';
import { checkMetricsPath } from '../exporter/metrics-path.js';
import { DEFAULT_ENERGY_SOURCE, ENERGY_SOURCE_CHOICES } from '../energy/kinds.js';
import { ENERGY_DOMAINS, isEnergyDomain, type EnergyDomain } from '../energy/energy-source.js';
import { DEFAULT_MAX_DISCOVERED_VMS } from '../discovery/discovery-limits.js';
import { DEFAULT_GUEST_ENERGY, GUEST_ENERGY_ENV, GUEST_ENERGY_MODES, type GuestEnergyMode } from '../guest-energy/modes.js';

/** Longest interval: a 32-bit counter wraps every 2^32 x 2^-ESU J (AMD's ESU 16: 65 kJ, 5 min at 200 W); one wrap an interval is recovered, two are not. */
const MAX_INTERVAL_S = 60;
/** The shortest sampling interval: below 10 ms a deadline rounds to nothing. */
const MIN_INTERVAL_S = 0.01;

export function intervalArg(flag: string) {
  return secondsArg(flag, {
    min: MIN_INTERVAL_S,
    max: MAX_INTERVAL_S,
    why: 'longer intervals could let the 32-bit energy counter wrap twice unseen',
  });
}

/** Seconds as a decimal number in [min, max] (min exclusive when 0); `why`, the bound's reason, ends the error. */
export function secondsArg(flag: string, o: { min?: number; max: number; why?: string }) {
  const min = o.min ?? 0;
  return (text: string): number => {
    const n = Number(text);
    const tooLow = min === 0 ? !(n > 0) : !(n >= min);
    if (!/^\d+(\.\d+)?$/.test(text.trim()) || tooLow || n > o.max) {
      const why = o.why === undefined ? '' : ` (${o.why})`;
      throw new InvalidArgumentError(
        `${flag} must be a number of seconds in ${min === 0 ? '(0' : `[${min}`}, ${o.max}], got ${JSON.stringify(text)}${why}`,
      );
    }
    return n;
  };
}

export function wholeNumberArg(flag: string, max = Number.MAX_SAFE_INTEGER, min = 1) {
  return (text: string): number => {
    if (!/^\d+$/.test(text)) throw new InvalidArgumentError(`${flag} must be a whole number, got ${JSON.stringify(text)}`);
    const n = Number(text);
    if (n < min || n > max) throw new InvalidArgumentError(`${flag} must be ${min}..${max}, got ${text}`);
    return n;
  };
}

/** A process id: 1..MAX_TID, the one bound of pids and tids. */
export function pidArg(text: string): number {
  if (!/^\d{1,10}$/.test(text) || Number(text) < 1 || Number(text) > MAX_TID)
    throw new InvalidArgumentError(`not a process id: ${JSON.stringify(text)}`);
  return Number(text);
}

/** `parse` as an argument parser: what it throws becomes commander's InvalidArgumentError. */
function argOf<T>(parse: (text: string) => T): (text: string) => T {
  return (text) => {
    try {
      return parse(text);
    } catch (e) {
      throw new InvalidArgumentError((e as Error).message);
    }
  };
}

/** "TID:VPKG,TID:VPKG,..." as vCPU specs. */
export const vcpuListArg: (text: string) => VcpuSpec[] = argOf(parseVcpuList);
/** --listen HOST:PORT (the exporter's HTTP address). */
export const listenAddressArg: (text: string) => ListenAddress = argOf(parseListenAddress);
/** --web.telemetry-path (the exporter's metrics path). */
export const metricsPathArg: (text: string) => string = argOf(checkMetricsPath);

/** A subcommand's options over its ancestors': the nearest value given, else the nearest default (optsWithGlobals() lets an ancestor's default win). */
export function commandOptions<T extends object = Record<string, unknown>>(cmd: Command): T {
  const chain: Command[] = [];
  for (let c: Command | null = cmd; c; c = c.parent) chain.push(c);
  const out: Record<string, unknown> = {};
  const given = new Set<string>();
  for (const c of chain) {
    for (const [key, value] of Object.entries(c.opts())) {
      const source = c.getOptionValueSource(key);
      const byUser = source !== undefined && source !== 'default' && source !== 'implied';
      if (given.has(key)) continue;
      if (byUser) given.add(key);
      else if (key in out) continue;
      out[key] = value;
    }
  }
  return out as T;
}

/** -k on the helper's clients; read it with commandOptions() (before the subcommand, the root's -k takes it). */
export function addClientSocketOption(cmd: Command): Command {
  return cmd.option('-k, --socket <path>', `the helper's socket (default '${DEFAULT_HELPER_SOCKET}')`);
}

export function clientSocket(o: { socket?: string }): string {
  return path.resolve(o.socket ?? DEFAULT_HELPER_SOCKET);
}

/** -v and -q, on the two commands that log (daemon, exporter); read with commandOptions(). */
export function addLogLevelOptions(cmd: Command): Command {
  return cmd.option('-v, --verbose', 'log debug messages').option('-q, --quiet', 'log warnings and errors only');
}

/** --socket-mode: "0600", "660", "0o660" -> number; permission bits only. */
export function parseSocketMode(text: string): number {
  const m = /^(?:0o?)?([0-7]{3})$/.exec(text.trim());
  if (!m) throw new UsageError(`--socket-mode: expected octal permission bits like 0600 or 0660 (got ${JSON.stringify(text)})`);
  const mode = parseInt(m[1]!, 8);
  if ((mode & 0o600) !== 0o600) throw new UsageError(`--socket-mode: the owner needs read and write (6 in the first digit), got ${m[1]}`);
  return mode;
}

/** --vendor: auto (from /proc/cpuinfo), intel or amd. */
function parseVendor(text: string | undefined): VendorChoice {
  const v = text ?? 'auto';
  if (v !== 'auto' && v !== 'intel' && v !== 'amd') throw new UsageError(`--vendor: expected auto, intel or amd (got '${v}')`);
  return v;
}

/** --msr-path: an absolute path template with exactly one %u for the CPU number. */
function parseMsrPath(text: string | undefined): string {
  const t = text ?? DEFAULT_HOST_PATHS.msrPathTemplate;
  try {
    validateMsrPathTemplate(t);
  } catch (e) {
    throw new UsageError(`--msr-path: ${(e as Error).message}; e.g. --msr-path /dev/cpu/%u/msr`);
  }
  if (!t.startsWith('/')) throw new UsageError(`--msr-path: must be absolute (got '${t}'); e.g. --msr-path /dev/cpu/%u/msr`);
  return t;
}

function absoluteDir(v: string | undefined, flag: string, dflt: string): string {
  if (v === undefined) return dflt;
  if (v === '') throw new UsageError(`${flag}: empty path`);
  return path.resolve(v);
}

export interface RawHostOptions {
  msrPath?: string;
  procRoot?: string;
  sysRoot?: string;
  vendor?: string;
}

export function hostOptionsFrom(raw: RawHostOptions): { paths: HostPaths; vendor: VendorChoice } {
  return {
    paths: {
      msrPathTemplate: parseMsrPath(raw.msrPath),
      procRoot: absoluteDir(raw.procRoot, '--proc-root', DEFAULT_HOST_PATHS.procRoot),
      sysRoot: absoluteDir(raw.sysRoot, '--sys-root', DEFAULT_HOST_PATHS.sysRoot),
    },
    vendor: parseVendor(raw.vendor),
  };
}

/** The host options, on the daemon and record; no commander defaults, so one given before 'record' reaches it. */
export function addHostOptions(cmd: Command): Command {
  return cmd
    .option('--msr-path <template>', `MSR device path, %u = CPU number (default '${DEFAULT_HOST_PATHS.msrPathTemplate}')`)
    .option('--proc-root <dir>', `procfs mount (default '${DEFAULT_HOST_PATHS.procRoot}')`)
    .option('--sys-root <dir>', `sysfs mount (default '${DEFAULT_HOST_PATHS.sysRoot}')`)
    .option('--vendor <vendor>', 'CPU vendor: auto|intel|amd (default auto, from /proc/cpuinfo)');
}

/** --energy-source, on the daemon and record: a source kind, or auto (energy/choose.ts). */
export function energySourceOption(auto = 'msr when an MSR device opens, else powercap'): Option {
  return new Option(
    '--energy-source <source>',
    'energy from the RAPL MSRs, the kernel powercap zones (no MSR: QEMU legacy requests then get 0), or synthesised from /proc/stat load; ' +
      `auto: ${auto}`,
  )
    .choices(ENERGY_SOURCE_CHOICES)
    .default(DEFAULT_ENERGY_SOURCE);
}

/** --domains, on the daemon and record: the RAPL domains to read; the package always. */
export function domainsOption(): Option {
  return new Option(
    '--domains <list>',
    `RAPL domains to read: ${ENERGY_DOMAINS.join(',')} (default: every one the host has; package always)`,
  ).argParser(domainsArg);
}

function domainsArg(text: string): EnergyDomain[] {
  const parts = text.split(',').map((p) => p.trim());
  const bad = parts.filter((p) => !isEnergyDomain(p));
  if (bad.length > 0 || parts.length === 0) {
    throw new InvalidArgumentError(
      `expected RAPL domains separated by commas, among ${ENERGY_DOMAINS.join(', ')} (got ${JSON.stringify(text)})`,
    );
  }
  return ENERGY_DOMAINS.filter((d) => parts.includes(d));
}

export function collect<T>(parse: (text: string) => T) {
  return (text: string, prev: T[] = []): T[] => [...prev, parse(text)];
}

function countOption(flags: string, description: string, dflt: number, max?: number): Option {
  return new Option(flags, description).argParser(wholeNumberArg(flags.split(' ')[0]!, max)).default(dflt);
}

export function addV2Options(cmd: Command): void {
  cmd
    .addOption(new Option('--interval <seconds>', 'v2 sampling interval in seconds').argParser(intervalArg('--interval')).default(1))
    .addOption(new Option('--record <trace>', 'write a vmsr-trace of what the v2 service samples (.jsonl or .jsonl.gz)'))
    .addOption(countOption('--max-vms <n>', 'v2 VMs registered at once, all clients', DEFAULT_V2_LIMITS.maxVms))
    .addOption(countOption('--max-vms-per-connection <n>', 'v2 VMs one connection may register', DEFAULT_V2_LIMITS.maxVmsPerConnection))
    .addOption(countOption('--max-vcpus <n>', 'vCPUs in one v2 VM', DEFAULT_V2_LIMITS.maxVcpus, MAX_VCPUS))
    .addOption(domainsOption())
    .addOption(
      new Option(
        '--guest-energy <mode>',
        "what a rapl=true guest reads: raw (the package counter, as QEMU's helper) or exact (its own VM's energy)",
      )
        .choices(GUEST_ENERGY_MODES)
        .env(GUEST_ENERGY_ENV)
        .default(DEFAULT_GUEST_ENERGY),
    )
    .addOption(new Option('--no-discovery', 'do not look for QEMU/KVM processes in /proc (only registered VMs are attributed)'))
    .addOption(
      countOption(
        '--max-discovered-vms <n>',
        'VM processes discovery tracks at once, and QEMU processes --guest-energy exact counts; a uid other than root or --socket-group gets a quarter, all such uids half',
        DEFAULT_MAX_DISCOVERED_VMS,
        1 << 20,
      ),
    )
    .addOption(
      countOption(
        '--max-vm-threads <n>',
        'threads of one VM the sampler keeps files open for; a VM with more is sampled from these (not whole)',
        DEFAULT_MAX_VM_THREADS,
        1 << 22,
      ),
    )
    .addOption(
      new Option(
        '--observer-group <group>',
        'group (name or gid) whose members see every VM and the host energy over v2 (e.g. the exporter)',
      ),
    )
    .addOption(
      new Option(
        '--guest-dir <dir>',
        'each VM whose directory DIR/<uuid>/ (or DIR/<name>/) exists gets its RAPL energy there as a powercap tree, to share with its guest (docs/guest.md)',
      ).default(DEFAULT_GUEST_DIR),
    )
    .addOption(new Option('--no-guest-dir', 'publish nothing into guest directories'))
    .addOption(
      new Option(
        '--power-limits <file>',
        "per-VM power limits, one 'VM WATTS' a line, read at the start and at each reload (docs/power-limits.md)",
      ),
    )
    .addOption(
      countOption(
        '--max-backlog <bytes>',
        'unread bytes queued to a v2 client before it is disconnected',
        DEFAULT_V2_LIMITS.maxBacklogBytes,
        1 << 30,
      ),
    );
}

export interface V2CliOptions {
  interval?: number;
  record?: string;
  maxVms?: number;
  maxVmsPerConnection?: number;
  maxVcpus?: number;
  maxBacklog?: number;
  /** false with --no-discovery (and --no-guest-dir). */
  discovery?: boolean;
  observerGroup?: string;
  domains?: EnergyDomain[];
  maxDiscoveredVms?: number;
  maxVmThreads?: number;
  guestDir?: string | false;
  guestEnergy?: GuestEnergyMode;
  powerLimits?: string;
}

export function v2OptionsFrom(opts: V2CliOptions, group: (spec: string) => number = (g) => resolveId(g, 'group')): V2DaemonSettings {
  const guestDir = opts.guestDir === false ? undefined : (opts.guestDir ?? DEFAULT_GUEST_DIR);
  if (guestDir !== undefined && !guestDir.startsWith('/'))
    throw new UsageError(`--guest-dir: the directory must be absolute (got '${guestDir}'); e.g. --guest-dir ${DEFAULT_GUEST_DIR}`);
  if (opts.powerLimits !== undefined && !opts.powerLimits.startsWith('/'))
    throw new UsageError(
      `--power-limits: the file must be absolute (got '${opts.powerLimits}'); e.g. --power-limits /etc/vmsr-helper/limits`,
    );
  return {
    intervalMs: Math.round((opts.interval ?? 1) * 1000),
    limits: {
      maxVms: opts.maxVms ?? DEFAULT_V2_LIMITS.maxVms,
      maxVmsPerConnection: opts.maxVmsPerConnection ?? DEFAULT_V2_LIMITS.maxVmsPerConnection,
      maxVcpus: opts.maxVcpus ?? DEFAULT_V2_LIMITS.maxVcpus,
      maxBacklogBytes: opts.maxBacklog ?? DEFAULT_V2_LIMITS.maxBacklogBytes,
    },
    discovery: opts.discovery !== false,
    recordPath: opts.record,
    domains: opts.domains,
    maxDiscoveredVms: opts.maxDiscoveredVms,
    maxVmThreads: opts.maxVmThreads,
    guestDir,
    guestEnergy: opts.guestEnergy,
    powerLimitsFile: opts.powerLimits,
    observerGid: opts.observerGroup === undefined ? undefined : flagged('--observer-group', () => group(opts.observerGroup!)),
  };
}

/** `f()`, its error a usage error named by `flag`. */
export function flagged<T>(flag: string, f: () => T): T {
  try {
    return f();
  } catch (e) {
    throw new UsageError(`${flag}: ${(e as Error).message}`);
  }
}
