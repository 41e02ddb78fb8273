/**
 * The limits file (--power-limits FILE; docs/power-limits.md "The limits file"): the operator's
 * standing limits, read at each start (a restart in place, `vmsr-helper reload`, reads it again),
 * one `VM WATTS [DOMAIN]` a line (DOMAIN a RAPL domain as ENERGY_DOMAINS names it, the package when left out), the VM named as `watch` names it (a pid, a UUID, a name: client/find-vm.ts's
 * order), `#` comments. A bad line is refused with its reason and the rest applied; the file is
 * bounded (MAX_FILE_BYTES, one limit per VM the helper may hold).
 */
import fs from 'node:fs';
import { cannot } from '../common/errors.js';
import { formatUuid } from '../common/uuid.js';
import { STATE_LIMITS } from '../state/snapshot.js';
import type { PowerLimiter } from './limiter.js';
import { ENERGY_DOMAINS, isEnergyDomain, type EnergyDomain } from '../model/domains.js';

const MAX_FILE_BYTES = 1 << 20;
const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const WATTS_RE = /^\d{1,7}(\.\d{1,3})?$/;

export interface LimitsFile {
  /** Watts per domain, by what names the VM: a pid's digits, a lowercase UUID, a name. */
  readonly byKey: ReadonlyMap<string, ReadonlyMap<EnergyDomain, number>>;
  /** Each refused line, as a "cannot" message. */
  readonly problems: readonly string[];
}

/** The file's text, parsed (pure); `domainProblem` refuses a domain the helper does not attribute (PowerLimiter's). */
export function parseLimitsFile(text: string, file: string, domainProblem: (d: EnergyDomain) => string | null = () => null): LimitsFile {
  const byKey = new Map<string, Map<EnergyDomain, number>>();
  const problems: string[] = [];
  const lines = text.split('\n');
  let count = 0;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!.replace(/#.*/, '').trim();
    if (line === '') continue;
    const refuse = (why: string, fix: string) => problems.push(cannot(`read line ${i + 1} of the limits file ${file}`, why, fix));
    const m = /^(\S+)\s+(\S+)(?:\s+(\S+))?$/.exec(line);
    if (!m) {
      refuse(
        'it is not a VM and a number of watts',
        "write 'VM WATTS [DOMAIN]', e.g. 'web1 35' (a name as 'virsh list' shows it, a UUID or a pid)",
      );
      continue;
    }
    const w = WATTS_RE.test(m[2]!) ? Number(m[2]) : NaN;
    const domain = m[3] ?? 'package';
    const limits = byKey.get(key(m[1]!)) ?? new Map<EnergyDomain, number>();
    if (!(w > 0)) refuse(`${JSON.stringify(m[2])} is not a number of watts above 0`, 'give watts, e.g. 35 or 12.5');
    else if (!isEnergyDomain(domain)) refuse(`${JSON.stringify(domain)} is not a RAPL domain`, `name one of ${ENERGY_DOMAINS.join(', ')}`);
    else if (domainProblem(domain) !== null) refuse(domainProblem(domain)!, 'remove the line or name a domain the helper attributes');
    else if (limits.has(domain))
      refuse(`${JSON.stringify(m[1])} has a ${domain} limit on an earlier line`, 'keep one line per VM and domain');
    else if (count >= STATE_LIMITS.maxPowerLimits)
      refuse(`the file has more than ${STATE_LIMITS.maxPowerLimits} limits, the most the helper holds`, 'limit fewer VMs');
    else {
      byKey.set(key(m[1]!), limits.set(domain, w));
      count++;
    }
  }
  return { byKey, problems };
}

const key = (vm: string) => (UUID_RE.test(vm) ? vm.toLowerCase() : vm);

/** Reads the file (a regular file, at most MAX_FILE_BYTES); an unreadable one gives no limits and says why. */
export function readLimitsFile(file: string, domainProblem?: (d: EnergyDomain) => string | null): LimitsFile {
  try {
    const st = fs.statSync(file);
    if (!st.isFile() || st.size > MAX_FILE_BYTES) throw new Error(`it is not a regular file of at most ${MAX_FILE_BYTES} bytes`);
    return parseLimitsFile(fs.readFileSync(file, 'utf8').slice(0, MAX_FILE_BYTES), file, domainProblem);
  } catch (e) {
    const fix = "make it a regular file the helper can read (as its -u user), one 'VM WATTS [DOMAIN]' a line";
    return { byKey: new Map(), problems: [cannot(`read the limits file ${file}`, (e as Error).message, fix)] };
  }
}

/** The file's limits of a VM: by its pid, else its UUID, else its name (find-vm.ts's order). */
function limitsOf(f: LimitsFile, vm: { pid: number; uuid: Uint8Array | null; name: string | null }) {
  return (
    f.byKey.get(String(vm.pid)) ??
    (vm.uuid ? f.byKey.get(formatUuid(vm.uuid)) : undefined) ??
    (vm.name !== null ? f.byKey.get(vm.name) : undefined)
  );
}

/**
 * Applies the file to the live VMs: each it names gets its limits (a limit set over v2 stands until
 * removed); a limit the file set and no longer names is removed (the file was changed, then reloaded).
 */
export function applyLimitsFile(
  f: LimitsFile,
  vms: Iterable<{ vmId: number; pid: number; uuid: Uint8Array | null; name: string | null; live: boolean }>,
  limiter: PowerLimiter,
): void {
  const fromFile = new Set(limiter.limited(true).map(([id, d]) => `${id} ${d}`));
  for (const vm of vms) {
    if (!vm.live) continue;
    const limits = limitsOf(f, vm);
    for (const domain of ENERGY_DOMAINS) {
      const [w, now, mine] = [limits?.get(domain), limiter.view(vm.vmId, domain), fromFile.has(`${vm.vmId} ${domain}`)];
      if (w === undefined && mine) limiter.set(vm.vmId, vm.pid, null, true, domain);
      if (w === undefined || (now !== undefined && (!mine || now.limitW === w))) continue;
      limiter.set(vm.vmId, vm.pid, w, true, domain);
    }
  }
}
