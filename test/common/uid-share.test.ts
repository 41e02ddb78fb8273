import { describe, expect, test } from 'vitest';
import { OTHERS_SHARE, ownerToEvict, shareOf, UID_SHARE, UidShares } from '../../src/budget/uid-share.js';

const nobody = { uid: 65534, preferred: false };
const alice = { uid: 1000, preferred: false };
const bob = { uid: 1001, preferred: false };
const root = { uid: 0, preferred: true };

describe('the per-uid share', () => {
  test('a uid that is not preferred takes at most its share of the capacity, then nothing, and the bound says why', () => {
    const s = new UidShares(4096);
    const share = shareOf(4096, UID_SHARE);
    expect(s.take(nobody, 4200)).toBe(share);
    expect(s.take(nobody, 1)).toBe(0);
    expect(s.room(nobody)).toEqual({ room: 0, bound: 'uid' });
    expect(s.heldBy(nobody.uid)).toBe(share);
  });

  test('uids that are not preferred hold together at most their share; a preferred owner still finds the rest', () => {
    const s = new UidShares(100);
    const uids = [alice, bob, nobody, { uid: 7, preferred: false }];
    let others = 0;
    for (const u of uids) others += s.take(u, 100);
    expect(others).toBe(shareOf(100, OTHERS_SHARE));
    expect(s.room({ uid: 8, preferred: false })).toEqual({ room: 0, bound: 'others' });
    expect(s.take(root, 1000)).toBe(100 - others);
    expect(s.room(root)).toEqual({ room: 0, bound: 'capacity' });
  });

  test('a preferred owner is bound only by the capacity, whatever it holds already', () => {
    const s = new UidShares(10);
    expect(s.take(root, 10)).toBe(10);
    expect(s.take(nobody, 1)).toBe(0);
    expect(s.room(nobody).bound).toBe('capacity');
  });

  test('what is given back can be taken again, by anyone; a uid that holds nothing is forgotten', () => {
    const s = new UidShares(8);
    expect(s.take(nobody, 8)).toBe(2);
    s.give(nobody, 2);
    expect(s.heldBy(nobody.uid)).toBe(0);
    expect(s.room(root)).toEqual({ room: 8, bound: 'capacity' }); // nothing held
    expect(s.others).toBe(0);
    expect(s.take(alice, 2)).toBe(2);
    s.give(alice, 5); // never below 0
    expect(s.room(root)).toEqual({ room: 8, bound: 'capacity' }); // nothing held
  });

  test('atLeast is taken even past the share (a main thread), and counted', () => {
    const s = new UidShares(8);
    s.take(nobody, 8);
    expect(s.take(nobody, 3, 1)).toBe(1);
    expect(s.heldBy(nobody.uid)).toBe(3);
  });

  test('a capacity too small for a quarter still gives each uid one; zero gives none; a bad capacity is refused', () => {
    expect(shareOf(3, UID_SHARE)).toBe(1);
    expect(new UidShares(0).take(root, 1)).toBe(0);
    expect(() => new UidShares(-1)).toThrow(/capacity must be a whole number/);
  });
});

describe('who gives way when a shared capacity is full', () => {
  test('the owner holding the most, only while it holds more than the asker would; never the asker; the first among equals', () => {
    for (let most = 0; most <= 6; most++)
      for (let wants = 0; wants <= 6; wants++) {
        const held = new Map([
          ['a', most],
          ['b', Math.min(most, 2)],
          ['asker', 99],
        ]);
        const got = ownerToEvict(held.keys(), (o) => held.get(o)!, 'asker', wants);
        expect(got, `most ${most}, wants ${wants}`).toBe(most > wants ? 'a' : undefined);
      }
    const tie = new Map([
      ['x', 3],
      ['y', 3],
    ]);
    expect(ownerToEvict(tie.keys(), (o) => tie.get(o)!, null, 0)).toBe('x');
    expect(ownerToEvict([], () => 1, null, 0)).toBeUndefined();
  });
});
