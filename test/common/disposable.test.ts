/** Listener lifetimes (src/common/disposable.ts): every listener added through them can be removed. */
import { EventEmitter } from 'node:events';
import { describe, expect, test } from 'vitest';
import { DisposableStore, listen, toDisposable } from '../../src/common/disposable.js';

describe('disposables', () => {
  test('listen adds one listener to a real EventEmitter and dispose removes exactly it', () => {
    const ee = new EventEmitter();
    const other = () => {};
    ee.on('x', other);
    let n = 0;
    const d = listen(ee, 'x', () => n++);
    ee.emit('x');
    expect(ee.listenerCount('x')).toBe(2);
    d.dispose();
    d.dispose();
    ee.emit('x');
    expect(n).toBe(1);
    expect(ee.listeners('x')).toEqual([other]);
  });

  test('a store disposes last-added first, once, and disposes at once what is added after', () => {
    const order: string[] = [];
    const store = new DisposableStore();
    store.add(toDisposable(() => order.push('a')));
    store.add(toDisposable(() => order.push('b')));
    store.dispose();
    store.dispose();
    expect(order).toEqual(['b', 'a']);
    store.add(toDisposable(() => order.push('late')));
    expect(order).toEqual(['b', 'a', 'late']);
  });

  test('a store disposes every item even when one throws, then rethrows the first error', () => {
    const done: string[] = [];
    const store = new DisposableStore();
    store.add(toDisposable(() => done.push('first')));
    store.add(
      toDisposable(() => {
        throw new Error('boom');
      }),
    );
    store.add(toDisposable(() => done.push('last')));
    expect(() => store.dispose()).toThrow('boom');
    expect(done).toEqual(['last', 'first']);
  });
});
