/**
 * Work in slices (src/sampling/time-slices.ts): what waits for the event loop runs between slices,
 * no slice runs much past its budget, and the work's result, error and stop come through.
 */
import { describe, expect, test } from 'vitest';
import { runInSlices, SLICE_BUDGET_MS } from '../../src/sampling/time-slices.js';

function busy(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end);
}

function* steps(n: number, stepMs: number, log: string[]): Generator<number, string, undefined> {
  for (let i = 0; i < n; i++) {
    busy(stepMs);
    log.push(`step ${i}`);
    yield i;
  }
  return 'done';
}

describe('runInSlices', () => {
  test('what waits for the event loop runs between slices when the work is longer than the budget', async () => {
    const log: string[] = [];
    const seen: number[] = [];
    // Something else waiting for the loop all along (as a legacy request would): it notes each turn.
    let going = true;
    const other = () =>
      setImmediate(() => {
        log.push('between');
        if (going) other();
      });
    other();
    // Each step takes half the budget: a slice is two or three steps, then the event loop turns.
    const r = await runInSlices(steps(40, SLICE_BUDGET_MS / 2, log), (v) => seen.push(v));
    going = false;
    expect(r).toBe('done');
    expect(seen).toEqual([...Array(40).keys()]);
    expect(log.filter((l) => l === 'between').length).toBeGreaterThanOrEqual(10);
    let run = 0;
    let longest = 0;
    for (const l of log) {
      run = l === 'between' ? 0 : run + 1;
      longest = Math.max(longest, run);
    }
    // A slice ends after the step that crossed the budget: at most budget/step + 1 steps in a row.
    expect(longest).toBeLessThanOrEqual(3);
  });

  test('short work runs in one go, synchronously, and resolves with what the iterator returns', async () => {
    const log: string[] = [];
    const p = runInSlices(steps(5, 0, log), () => {});
    expect(log).toHaveLength(5); // done before runInSlices returned
    expect(await p).toBe('done');
  });

  test('a step that throws rejects with its error and no step after it runs', async () => {
    let ran = 0;
    function* failing(): Generator<number, void, undefined> {
      yield ran++;
      throw new Error('cannot read /proc/1/stat: EMFILE');
    }
    await expect(runInSlices(failing(), () => ran++)).rejects.toThrow('EMFILE');
    expect(ran).toBe(2);
  });

  test('stopped() ends the work before the next step and resolves with undefined', async () => {
    const log: string[] = [];
    let n = 0;
    const r = await runInSlices(steps(10, 0, log), () => n++, { stopped: () => n >= 3 });
    expect(r).toBeUndefined();
    expect(n).toBe(3);
  });
});
