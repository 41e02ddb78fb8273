/**
 * The rule that a discovered VM's virtual packages are the guest sockets its vCPU threads are in
 * (src/discovery/vpkg-numbering.ts): pure, so every case is given directly.
 */
import { describe, expect, it } from 'vitest';
import { VpkgNumbering } from '../../src/discovery/vpkg-numbering.js';

const asObject = (m: ReadonlyMap<number, number>) => Object.fromEntries(m);

describe('VpkgNumbering', () => {
  it('numbers sockets that all hold vCPUs as themselves (vpkg n = guest socket n)', () => {
    const n = new VpkgNumbering();
    expect(asObject(n.number([0, 0, 1, 1, 2, 3]))).toEqual({ 0: 0, 1: 1, 2: 2, 3: 3 });
    expect(n.count).toBe(4);
  });

  it('gives one virtual package to a VM whose one thread claims socket 255', () => {
    const n = new VpkgNumbering();
    expect(asObject(n.number([255]))).toEqual({ 255: 0 });
    expect(n.count).toBe(1);
  });

  it('keeps the number of a socket that still has threads when another socket joins', () => {
    const n = new VpkgNumbering();
    n.number([0, 2]);
    expect(asObject(n.number([0, 2, 1]))).toEqual({ 0: 0, 2: 1, 1: 2 });
    expect(n.count).toBe(3);
  });

  it('never has more virtual packages than the most sockets in use at once when a thread hops across sockets', () => {
    const n = new VpkgNumbering();
    // One thread renamed through 256 socket claims, one sample each: one virtual package throughout.
    for (let s = 0; s < 256; s++) expect(asObject(n.number([s]))).toEqual({ [s]: 0 });
    expect(n.count).toBe(1);
  });

  it('gives a new socket the lowest number of a socket left empty once every number is given out', () => {
    const n = new VpkgNumbering();
    n.number([0, 1, 2]); // 0->0, 1->1, 2->2
    expect(asObject(n.number([0, 2, 7]))).toEqual({ 0: 0, 2: 2, 7: 1 });
    expect(asObject(n.number([5, 6, 7]))).toEqual({ 7: 1, 5: 0, 6: 2 });
    expect(n.count).toBe(3);
  });

  it('gives no virtual package when no socket is in use, and keeps those it gave', () => {
    const n = new VpkgNumbering();
    n.number([3, 4]);
    expect(n.number([]).size).toBe(0);
    expect(n.count).toBe(2);
  });
});
