/**
 * A QEMU command line's -name, -uuid, machine type version (-machine/-M) and -smp. Hostile input: arguments are bounded,
 * every number checked, anything not understood ignored (the VM is attributed with docs/discovery.md's defaults).
 */
import { MAX_VCPUS, MAX_VPKG } from '../model/vcpus.js';

/** Bytes of /proc/<pid>/cmdline looked at; a longer command line is cut (its last argument dropped). */
export const MAX_CMDLINE_BYTES = 128 * 1024;
const MAX_ARGS = 4096;

export interface SmpTopology {
  /** vCPUs at start (`cpus=`). */
  cpus: number;
  maxcpus: number;
  sockets: number;
  /** vCPU indices per socket: dies x clusters x modules x cores x threads (cpu_index is socket-major). */
  perSocket: number;
}

interface QemuCommandLine {
  name: string | null;
  /** 16 bytes, or null when absent or not a UUID. */
  uuid: Buffer | null;
  topology: SmpTopology;
  /** Problems worth a log line (bad -smp, bad -uuid); the VM is discovered anyway. */
  problems: string[];
}

/** Splits NUL-separated /proc/<pid>/cmdline bytes into arguments, bounded. */
export function splitCmdline(raw: Buffer): string[] {
  let buf = raw.subarray(0, MAX_CMDLINE_BYTES);
  const cut = raw.length > MAX_CMDLINE_BYTES;
  if (buf.length > 0 && buf[buf.length - 1] === 0) buf = buf.subarray(0, buf.length - 1);
  if (buf.length === 0) return [];
  const args = buf.toString('utf8').split('\0');
  if (cut) args.pop();
  return args.slice(0, MAX_ARGS);
}

/** QEMU's `key=value,key=value` (a doubled comma is a literal one); a bare first part is the value of `impliedKey`. */
export function parseQemuOpts(text: string, impliedKey: string): Map<string, string> {
  // A command line's arguments hold no NUL (it separates them): it stands for a literal comma here.
  const parts = text
    .replace(/,,/g, '\0')
    .split(',')
    .map((p) => p.replace(/\0/g, ','));
  const out = new Map<string, string>();
  parts.forEach((p, i) => {
    const eq = p.indexOf('=');
    if (eq < 0) {
      if (i === 0 && p !== '') out.set(impliedKey, p);
      return;
    }
    out.set(p.slice(0, eq), p.slice(eq + 1));
  });
  return out;
}

/** The longest VM name taken from a command line (libvirt/OpenStack names are far shorter). */
const MAX_VM_NAME = 256;

/** The last `-name [guest=]NAME,...`; null when none, empty, over MAX_VM_NAME or with control characters (logs, labels). */
export function guestNameOf(args: readonly string[]): string | null {
  const opt = lastOption(args, '-name');
  if (opt === null) return null;
  const g = parseQemuOpts(opt, 'guest').get('guest');
  if (g === undefined || g === '' || g.length > MAX_VM_NAME || /[\u0000-\u001f\u007f-\u009f]/.test(g)) return null;
  return g;
}

const UUID_RE = /^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$/;

const SMP_KEYS = ['cpus', 'maxcpus', 'drawers', 'books', 'sockets', 'dies', 'clusters', 'modules', 'cores', 'threads'] as const;
type SmpKey = (typeof SMP_KEYS)[number];

/** One vCPU, one socket: QEMU's default without -smp, and our fallback for a -smp we refuse. */
const SINGLE: SmpTopology = { cpus: 1, maxcpus: 1, sockets: 1, perSocket: 1 };

/**
 * -smp as QEMU 10's machine_parse_smp_config: omitted members are 1, or, given cpus or maxcpus, filled from maxcpus by the
 * machine's preference (cores since 6.2, sockets before; threads last). What QEMU would refuse is an error.
 */
export function parseSmp(text: string, preferSockets: boolean): SmpTopology | { error: string } {
  const o = parseQemuOpts(text, 'cpus');
  const v: Partial<Record<SmpKey, number>> = {};
  for (const [k, raw] of o) {
    if (!(SMP_KEYS as readonly string[]).includes(k)) return { error: `-smp: unknown key '${k}'` };
    if (!/^\d{1,6}$/.test(raw)) return { error: `-smp: ${k}=${raw} is not a number` };
    const n = Number(raw);
    if (n === 0) return { error: `-smp: ${k}=0 (QEMU refuses zero)` };
    v[k as SmpKey] = n;
  }
  const drawers = v.drawers ?? 1;
  const books = v.books ?? 1;
  const dies = v.dies ?? 1;
  const clusters = v.clusters ?? 1;
  const modules = v.modules ?? 1;
  let sockets = v.sockets ?? 0;
  let cores = v.cores ?? 0;
  let threads = v.threads ?? 0;
  let cpus = v.cpus ?? 0;
  let maxcpus = v.maxcpus ?? 0;
  const fixed = drawers * books * dies * clusters * modules;
  if (cpus === 0 && maxcpus === 0) {
    sockets ||= 1;
    cores ||= 1;
    threads ||= 1;
  } else {
    maxcpus ||= cpus;
    // The machine's preferred one of sockets and cores is filled first; the other is then 1 when omitted.
    let [first, second] = preferSockets ? [sockets, cores] : [cores, sockets];
    if (first === 0) {
      second ||= 1;
      threads ||= 1;
      first = Math.floor(maxcpus / (fixed * second * threads));
    } else if (second === 0) {
      threads ||= 1;
      second = Math.floor(maxcpus / (fixed * first * threads));
    }
    [sockets, cores] = preferSockets ? [first, second] : [second, first];
    if (threads === 0) threads = Math.floor(maxcpus / (fixed * sockets * cores));
  }
  const total = fixed * sockets * cores * threads;
  maxcpus ||= total;
  cpus ||= maxcpus;
  if (total === 0 || total !== maxcpus) return { error: `-smp ${text}: the topology's product (${total}) is not maxcpus (${maxcpus})` };
  if (maxcpus < cpus) return { error: `-smp ${text}: maxcpus ${maxcpus} is below cpus ${cpus}` };
  if (maxcpus > MAX_VCPUS) return { error: `-smp ${text}: ${maxcpus} vCPUs is over the limit of ${MAX_VCPUS}` };
  const allSockets = drawers * books * sockets;
  if (allSockets - 1 > MAX_VPKG) return { error: `-smp ${text}: ${allSockets} sockets is over the limit of ${MAX_VPKG + 1}` };
  return { cpus, maxcpus, sockets: allSockets, perSocket: dies * clusters * modules * cores * threads };
}

/** Machine types before 6.2 (e.g. pc-i440fx-6.1, pc-q35-5.2) prefer sockets when filling -smp. */
export function machinePrefersSockets(machine: string | null): boolean {
  const m = machine === null ? null : /-(\d+)\.(\d+)$/.exec(machine);
  return m !== null && (Number(m[1]) < 6 || (Number(m[1]) === 6 && Number(m[2]) < 2));
}

/** The last occurrence of `-opt`/`--opt` wins, as in QEMU. */
function lastOption(args: readonly string[], ...names: string[]): string | null {
  let found: string | null = null;
  for (let i = 1; i < args.length - 1; i++) {
    const a = args[i]!;
    const bare = a.startsWith('--') ? a.slice(1) : a;
    if (names.includes(bare)) found = args[i + 1]!;
  }
  return found;
}

export function parseQemuCommandLine(args: readonly string[]): QemuCommandLine {
  const problems: string[] = [];
  const name = guestNameOf(args);
  let uuid: Buffer | null = null;
  const uuidOpt = lastOption(args, '-uuid');
  if (uuidOpt !== null) {
    uuid = UUID_RE.test(uuidOpt) ? Buffer.from(uuidOpt.replace(/-/g, ''), 'hex') : null;
    if (uuid === null) problems.push(`-uuid ${uuidOpt.slice(0, 64)} is not a UUID`);
  }
  const machineOpt = lastOption(args, '-machine', '-M');
  const machine = machineOpt === null ? null : (parseQemuOpts(machineOpt, 'type').get('type') ?? null);
  let topology = SINGLE;
  const smpOpt = lastOption(args, '-smp');
  if (smpOpt !== null) {
    const t = parseSmp(smpOpt.slice(0, 1024), machinePrefersSockets(machine));
    if ('error' in t) problems.push(`${t.error}; every vCPU is put in virtual package 0`);
    else topology = t;
  }
  return { name, uuid, topology, problems };
}

/** The guest socket of vCPU `index` (cpu_index, as in `CPU <index>/KVM`) in the command line's topology, at most MAX_VPKG. */
export function socketOf(topology: SmpTopology, index: number): number {
  const g = Math.floor(index / topology.perSocket);
  return g > MAX_VPKG ? MAX_VPKG : g;
}
