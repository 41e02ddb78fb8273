/**
 * Arrays refilled in place at each sample (the statistics files, the engine's totals read in place):
 * cut to their new length when shorter, left alone otherwise, since setting an array's length is a
 * slow call in V8 even when it does not change.
 */

/** `a` cut to `n` items when longer. */
export function fitLength(a: unknown[], n: number): void {
  if (a.length > n) a.length = n;
}
