/** What a start inherits instead of opening it (from systemd, the keeper, the image before an exec); across an exec, in INHERIT_ENV. */
import type { HostCpu, Vendor } from '../../model/host.js';
import { isEnergySourceKind, type EnergySourceKind } from '../../energy/kinds.js';
import { cannotError } from '../../common/errors.js';
import { takeEnvJson } from '../../common/env-json.js';
import { takeFromKeeper } from '../../keeper/link.js';

export const INHERIT_ENV = 'VMSR_HELPER_INHERIT';

const INHERITED_FROM = ['fresh', 'systemd', 'keeper', 'reexec', 'restart'] as const;
export type InheritedFrom = (typeof INHERITED_FROM)[number];

export interface Inherited {
  how: InheritedFrom;
  /** The checks' results, from a run with root (energy absent: msr). */
  checks?: { vendor: Vendor; cpus: HostCpu[]; energy?: EnergySourceKind; energyWhy?: string };
  /** [cpu, fd] of each MSR device, opened as root; needs `checks`. */
  msr?: [number, number][];
  /** [path, fd] of each powercap energy_uj file, opened as root (energy source powercap). */
  powercap?: [string, number][];
  listener?: {
    fd: number;
    /** The socket file bound for it (ours to remove at close: server/listener.ts's SocketFile); absent for systemd's socket. */
    file?: { path: string; ino: number };
  };
  /** The pidfile written for this pid (which an exec keeps). */
  pidfile?: string;
  /** [path, fd] of files the v2 service writes (--record), created before the privilege drop. */
  files?: [string, number][];
  /** Privileges are dropped already, on every thread (the re-exec did it). */
  dropped?: boolean;
  /** Further fds by name (LISTEN_FDNAMES, the keeper's, a restart's). */
  named?: ReadonlyMap<string, readonly number[]>;
}

/** `i` with each fd replaced by `to(fd)`, called in one order: the MSR devices, powercap, the listener, the files, the named. */
function mapFds(i: Inherited, to: (fd: number) => number): Inherited {
  return {
    ...i,
    ...(i.msr ? { msr: i.msr.map(([cpu, fd]) => [cpu, to(fd)]) } : {}),
    ...(i.powercap ? { powercap: i.powercap.map(([p, fd]) => [p, to(fd)]) } : {}),
    ...(i.listener ? { listener: { ...i.listener, fd: to(i.listener.fd) } } : {}),
    ...(i.files ? { files: i.files.map(([p, fd]) => [p, to(fd)]) } : {}),
    ...(i.named ? { named: new Map([...i.named].map(([n, fds]) => [n, fds.map(to)])) } : {}),
  };
}

export function inheritedFds(i: Inherited): number[] {
  const fds: number[] = [];
  mapFds(i, (fd) => (fds.push(fd), fd));
  return fds;
}

/** `i` with the fd at place n of inheritedFds(i) as `first + n` (how the keeper passes them on). */
export function renumbered(i: Inherited, first: number): Inherited {
  let next = first;
  return mapFds(i, () => next++);
}

/** The environment that carries `i` across an exec (takeInherited reads it back). */
export function inheritEnv(i: Inherited): Record<string, string> {
  const { named, checks, ...rest } = i;
  const encoded = {
    ...rest,
    ...(checks ? { checks: { ...checks, cpus: checks.cpus.map((c) => ({ cpu: c.cpu, package: c.pkg })) } } : {}),
    ...(named ? { named: [...named] } : {}),
  };
  return { [INHERIT_ENV]: JSON.stringify(encoded) };
}

const isFd = (v: unknown): v is number => Number.isInteger(v) && (v as number) >= 0 && (v as number) < 1 << 20;
const isCpu = (v: unknown): v is number => Number.isInteger(v) && (v as number) >= 0 && (v as number) < 1 << 16;
const isString = (v: unknown): v is string => typeof v === 'string';
const isFdList = (v: unknown): v is number[] => Array.isArray(v) && v.every(isFd);
const pairs = (a: (v: unknown) => boolean, b: (v: unknown) => boolean) => (v: unknown) =>
  Array.isArray(v) && v.every((e) => Array.isArray(e) && e.length === 2 && a(e[0]) && b(e[1]));
const maybe = <T>(v: T | undefined, ok: (v: T) => boolean): boolean => v === undefined || ok(v);

/** Inherited as the environment carries it; a cpu's package id keeps the key `package` an older image reads. */
type Encoded = Omit<Inherited, 'named' | 'checks'> & {
  checks?: Omit<NonNullable<Inherited['checks']>, 'cpus'> & { cpus: { cpu: number; package: number }[] };
  named?: [string, number[]][];
};

function valid(v: Partial<Encoded>): v is Encoded {
  const c = v.checks;
  return (
    (INHERITED_FROM as readonly unknown[]).includes(v.how) &&
    (c === undefined ||
      ((c.vendor === 'intel' || c.vendor === 'amd') &&
        Array.isArray(c.cpus) &&
        c.cpus.every((x) => isCpu(x?.cpu) && isCpu(x?.package)) &&
        maybe(c.energy, isEnergySourceKind) &&
        maybe(c.energyWhy, isString))) &&
    maybe(v.msr, (m) => c !== undefined && pairs(isCpu, isFd)(m)) &&
    maybe(v.powercap, (p) => c !== undefined && pairs(isString, isFd)(p)) &&
    maybe(v.listener, (l) => isFd(l.fd) && maybe(l.file, (f) => isString(f.path) && Number.isInteger(f.ino))) &&
    maybe(v.pidfile, isString) &&
    maybe(v.files, pairs(isString, isFd)) &&
    maybe(v.dropped, (d) => typeof d === 'boolean') &&
    maybe(v.named, pairs(isString, isFdList))
  );
}

/** The Inherited left by the image before the exec (removed from the environment), or null; what a keeper held is added by name. */
export function takeInherited(env: NodeJS.ProcessEnv = process.env): Inherited | null {
  const v = takeEnvJson<Encoded>(INHERIT_ENV, valid, env);
  if (v === undefined) return null;
  if (v === null)
    throw cannotError(`read ${INHERIT_ENV}`, 'it is not JSON or is malformed', 'it is set by the helper for itself, do not set it');
  const { named, checks, ...rest } = v;
  const kept = takeFromKeeper(env);
  const all = new Map([...(named ?? []), ...(kept ?? [])]);
  return {
    ...rest,
    ...(kept ? { how: 'keeper' as const } : {}),
    ...(checks ? { checks: { ...checks, cpus: checks.cpus.map((c) => ({ cpu: c.cpu, pkg: c.package })) } } : {}),
    ...(all.size > 0 ? { named: all } : {}),
  };
}
