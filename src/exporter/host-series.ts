/**
 * --host-series: who may read the host packages' energy: all, authenticated (a right password or a
 * verified client certificate), none. The kernel made the powercap energy files root-only
 * (CVE-2020-8694): sampled often, a package's energy tells what other users compute. docs/security.md
 * weighs the choice and its default.
 */
export const HOST_SERIES_CHOICES = ['all', 'authenticated', 'none'] as const;
export type HostSeries = (typeof HOST_SERIES_CHOICES)[number];
export const DEFAULT_HOST_SERIES: HostSeries = 'all';

/** Whether a request sees the host families. */
export function showsHostSeries(policy: HostSeries, authenticated: boolean): boolean {
  return policy === 'all' || (policy === 'authenticated' && authenticated);
}
