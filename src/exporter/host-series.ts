/**
 * --host-series: who may read the host packages' energy: all, authenticated (a password or a verified client certificate),
 * none. Sampled often, it tells what other users compute (CVE-2020-8694: powercap is root-only); docs/security.md weighs it.
 */
export const HOST_SERIES_CHOICES = ['all', 'authenticated', 'none'] as const;
export type HostSeries = (typeof HOST_SERIES_CHOICES)[number];
export const DEFAULT_HOST_SERIES: HostSeries = 'all';

export function showsHostSeries(policy: HostSeries, authenticated: boolean): boolean {
  return policy === 'all' || (policy === 'authenticated' && authenticated);
}
