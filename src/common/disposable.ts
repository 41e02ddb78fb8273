/** Listener lifetimes, one way: adding returns a Disposable that removes it; a DisposableStore removes a group, last first. */

export interface Disposable {
  dispose(): void;
}

/** A Disposable running `fn` once, however often it is disposed. */
export function toDisposable(fn: () => void): Disposable {
  let done = false;
  return {
    dispose() {
      if (done) return;
      done = true;
      fn();
    },
  };
}

/** The on/off pair of a Node EventEmitter (process, sockets, servers). */
export interface EmitterLike<A extends unknown[]> {
  on(event: string, listener: (...args: A) => void): unknown;
  off(event: string, listener: (...args: A) => void): unknown;
}

/** Adds `listener` to `emitter` for `event`; disposing removes exactly that listener. */
export function listen<A extends unknown[]>(emitter: EmitterLike<A>, event: string, listener: (...args: A) => void): Disposable {
  emitter.on(event, listener);
  return toDisposable(() => emitter.off(event, listener));
}

/** Disposables disposed together. One added after the store was disposed is disposed at once. */
export class DisposableStore implements Disposable {
  private items: Disposable[] = [];
  private disposed = false;

  add<T extends Disposable>(d: T): T {
    if (this.disposed) d.dispose();
    else this.items.push(d);
    return d;
  }

  /** Disposes everything, last added first; an error in one does not stop the others (the first is rethrown). */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    const items = this.items.reverse();
    this.items = [];
    let first: unknown;
    for (const d of items) {
      try {
        d.dispose();
      } catch (e) {
        first ??= e;
      }
    }
    if (first !== undefined) throw first;
  }
}
