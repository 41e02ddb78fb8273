/**
 * Long work (a /proc scan in a storm of new processes, the stat lines of hundreds of VMs) done in
 * slices of SLICE_BUDGET_MS, the rest waiting for the next turn of the event loop (setImmediate) so
 * that QEMU's legacy requests ready meanwhile are served between slices. A step is never cut.
 */

/** Work per event-loop turn, ms: about the most a legacy request waits behind discovery or sampling (docs/daemon.md, "What other users cannot delay"). */
export const SLICE_BUDGET_MS = 2;

interface SliceOptions {
  budgetMs?: number;
  /** Checked before each step: true stops the work (the service closed); the promise then resolves with undefined. */
  stopped?: () => boolean;
}

/**
 * Runs `steps` to their end, calling `each` with every value, in slices; resolves with what the
 * iterator returns (undefined when stopped). Rejects with the first error a step or `each` throws
 * (the steps left are not run). The first slice runs at once, synchronously.
 */
export function runInSlices<T, R>(steps: Iterator<T, R>, each: (v: T) => void, o: SliceOptions = {}): Promise<R | undefined> {
  const budget = o.budgetMs ?? SLICE_BUDGET_MS;
  return new Promise<R | undefined>((resolve, reject) => {
    const slice = (): void => {
      const began = performance.now();
      try {
        for (;;) {
          if (o.stopped?.() === true) return resolve(undefined);
          const r = steps.next();
          if (r.done === true) return resolve(r.value);
          each(r.value);
          if (performance.now() - began >= budget) break;
        }
      } catch (e) {
        return reject(e instanceof Error ? e : new Error(String(e)));
      }
      setImmediate(slice);
    };
    slice();
  });
}

/** `then(v)` at once when `v` is at hand, once it resolves when it is a promise (one that never rejects): an interval stays synchronous when nothing is sliced. */
export function settled<T>(v: T | Promise<T>, then: (v: T) => void): void {
  if (v instanceof Promise) void v.then(then);
  else then(v);
}
