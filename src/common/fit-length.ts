/** `a` (refilled in place each sample) cut to `n` items when longer: setting a length is slow in V8 even when it does not change. */
export function fitLength(a: unknown[], n: number): void {
  if (a.length > n) a.length = n;
}
