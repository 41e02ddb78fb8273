/** THE rule for a host's list of other-domain counters: what the engine takes and a trace header may carry. */
import { isOtherDomain, PLATFORM_DOMAINS } from '../model/domains.js';
import type { DomainCounter } from '../model/host.js';

/** The largest counter range the engine takes: its values are held as float64 integers. */
const MAX_DOMAIN_RANGE = 2n ** 53n;

/** The largest unit a counter may count in: 1 J (PSYS on Sapphire Rapids). */
const MAX_DOMAIN_UNIT_J = 1;

/** Why `d` cannot be one of the host's domain counters, given those listed before it; undefined when it can. */
export function domainCounterProblem(
  d: DomainCounter,
  packages: { has(pkg: number): boolean },
  before: readonly DomainCounter[],
): string | undefined {
  const at = `the ${String(d.domain)} counter of package ${d.pkg}`;
  if (!isOtherDomain(d.domain)) return `${at}: not a RAPL domain besides the package (core, uncore, dram or psys)`;
  if (!packages.has(d.pkg)) return `${at}: package ${d.pkg} is not among the host's packages`;
  if (typeof d.range !== 'bigint' || d.range < 2n || d.range > MAX_DOMAIN_RANGE) return `${at}: range ${d.range} is out of 2..2^53`;
  if (typeof d.unitJ !== 'number' || !Number.isFinite(d.unitJ) || d.unitJ <= 0 || d.unitJ > MAX_DOMAIN_UNIT_J)
    return `${at}: unit ${d.unitJ} J is not a number of joules in (0, ${MAX_DOMAIN_UNIT_J}]`;
  if (before.some((b) => b.domain === d.domain && b.pkg === d.pkg)) return `${at} is listed twice`;
  if (PLATFORM_DOMAINS.has(d.domain) && before.some((b) => b.domain === d.domain))
    return `${at}: ${d.domain} counts the whole platform and is listed once`;
  return undefined;
}
