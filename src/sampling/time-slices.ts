/**
 * Long work (a /proc scan in a storm of new processes, hundreds of VMs' stat lines) in slices of SLICE_BUDGET_MS, the rest
 * after setImmediate, so QEMU's legacy requests are served between slices. A step is never cut.
 */

/** Work per event-loop turn, ms: about the most a legacy request waits behind discovery or sampling (docs/daemon.md, "What other users cannot delay"). */
export const SLICE_BUDGET_MS = 2;

interface SliceOptions {
  budgetMs?: number;
  /** Checked before each step: true stops the work (the service closed); the promise then resolves with undefined. */
  stopped?: () => boolean;
}

/**
 * Runs `steps` to their end in slices (the first at once, synchronously), `each` with every value; resolves with what the
 * iterator returns (undefined when stopped), rejects with the first error a step or `each` throws (no step runs after).
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
