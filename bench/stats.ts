/** Figures over repeats: a ratio's median and its spread (min..max over the repeats). */

export function median(xs: readonly number[]): number {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** "0.93 (0.88–1.02)": median of the per-repeat ratios and their range. */
export function ratioText(ours: readonly number[], theirs: readonly number[]): string {
  const r = ours.map((o, i) => o / theirs[i]!).filter((x) => Number.isFinite(x));
  if (r.length === 0) return 'n/a';
  return `${median(r).toFixed(2)} (${Math.min(...r).toFixed(2)}–${Math.max(...r).toFixed(2)})`;
}

/** "12.3 (11.9–13.0)" of plain values. */
export function spreadText(xs: readonly number[], digits = 1): string {
  const f = xs.filter((x) => Number.isFinite(x));
  if (f.length === 0) return 'n/a';
  return `${median(f).toFixed(digits)} (${Math.min(...f).toFixed(digits)}–${Math.max(...f).toFixed(digits)})`;
}

/** The q-th percentile of round trips (sorted in place), as legacy-load.c picks it: the value at floor(n·q/100). */
export function percentile(xs: Uint32Array, q: number): number {
  if (xs.length === 0) return NaN;
  xs.sort();
  return xs[Math.min(xs.length - 1, Math.floor((xs.length * q) / 100))]!;
}

export function printTable(rows: string[][]): void {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? '').length)));
  for (const r of rows) console.log(r.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  '));
}
