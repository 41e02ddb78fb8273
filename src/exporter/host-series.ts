/**
 * --host-series: who may read the host packages' energy (registerHostFamilies in metrics.ts). The kernel
 * made the powercap energy files root-only (CVE-2020-8694) because a reader who samples a package's
 * energy often enough learns about what other users compute; the exporter serves those totals over
 * HTTP. docs/security.md weighs the choice and its default.
 *
 *  - all: every reader that may scrape (the default);
 *  - authenticated: only a request that proved who it is, by a password (basic_auth_users) or a
 *    client certificate verified against client_ca_file; without a web configuration that asks for
 *    either, nobody;
 *  - none: nobody.
 */
export const HOST_SERIES_CHOICES = ['all', 'authenticated', 'none'] as const;
export type HostSeries = (typeof HOST_SERIES_CHOICES)[number];
export const DEFAULT_HOST_SERIES: HostSeries = 'all';

/** Whether a request sees the host families. */
export function showsHostSeries(policy: HostSeries, authenticated: boolean): boolean {
  return policy === 'all' || (policy === 'authenticated' && authenticated);
}
