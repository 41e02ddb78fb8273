/** Power from energy over time, as every reader of the daemon's counters computes it. */

/** Watts from the µJ counted over `dtNs` nanoseconds (µJ per ns x 1e3), or null when there is no interval (dtNs <= 0). */
export function wattsOver(deltaUj: bigint, dtNs: number): number | null {
  return dtNs > 0 ? (Number(deltaUj) * 1e3) / dtNs : null;
}
