/**
 * ConnectionSeats: the connection slots shared between users. When all are taken, a user holding
 * fewer connections than another gets one by closing the oldest connection not read yet of the user
 * holding the most; connections being served are never closed for another user.
 */
import { describe, expect, it } from 'vitest';
import { ConnectionSeats } from '../../../src/helper/server/connection-seats.js';

function seats() {
  const s = new ConnectionSeats(100);
  const closed: string[] = [];
  const open = (uid: number, name: string) => s.seat({ uid, preferred: true }, () => closed.push(name));
  return { s, closed, open };
}

describe('ConnectionSeats', () => {
  it('closes the oldest undecided connection of the user holding the most for a user holding fewer', () => {
    const { s, closed, open } = seats();
    for (let i = 0; i < 4; i++) open(65534, `flood ${i}`);
    open(107, 'qemu');
    expect(s.makeRoomFor(107)).toBe(true);
    expect(closed).toEqual(['flood 0']);
    // The flood's own new connection takes nothing from a user holding fewer.
    expect(s.makeRoomFor(65534)).toBe(false);
    expect(closed).toEqual(['flood 0']);
  });

  it('never closes a connection being served, and takes nothing from a user holding no more than the one asking would', () => {
    const { s, closed, open } = seats();
    for (let i = 0; i < 3; i++) open(1, `served ${i}`).decided();
    expect(s.makeRoomFor(2)).toBe(false); // user 1 holds more, but all of its connections are served
    open(3, 'a');
    open(3, 'b');
    open(2, 'c');
    expect(s.makeRoomFor(2)).toBe(false); // user 3 holds 2, user 2 would hold 2
    expect(closed).toEqual([]);
  });

  it('counts a connection until it is released, once however often', () => {
    const { s, open } = seats();
    const a = open(9, 'a');
    open(9, 'b');
    a.release();
    a.release();
    expect(s.shares.heldBy(9)).toBe(1);
  });

  it("counts each connection against its uid's share: a user that is not preferred holds at most a quarter, served ones too", () => {
    const s = new ConnectionSeats(8);
    const other = { uid: 65534, preferred: false };
    const a = s.seat(other, () => {});
    a.decided();
    s.seat(other, () => {});
    expect(s.shares.room(other)).toEqual({ room: 0, bound: 'uid' });
    expect(s.shares.room({ uid: 0, preferred: true })).toEqual({ room: 6, bound: 'capacity' });
    a.release();
    expect(s.shares.room(other)).toEqual({ room: 1, bound: 'uid' });
  });

  it("gives a QEMU process's first connection a slot by closing the oldest connection that is not QEMU's of the user holding the most, served or not", () => {
    const { s, closed, open } = seats();
    for (let i = 0; i < 3; i++) open(1000, `served ${i}`).decided();
    open(1001, 'other');
    expect(s.qemuFirst(4242)).toBe(true);
    const qemu = s.seat({ uid: 64055, preferred: false }, () => closed.push('qemu'), 4242);
    // Outside the shares: the QEMU uid holds nothing against its quarter.
    expect(s.shares.heldBy(64055)).toBe(0);
    expect(s.qemuFirst(4242)).toBe(false);
    expect(s.makeRoomForQemu()).toBe(true);
    expect(closed).toEqual(['served 0']);
    // A QEMU's connection is never closed for QEMU or another user: with only QEMU's left, nothing is.
    const only = new ConnectionSeats(2);
    only.seat({ uid: 64055, preferred: false }, () => closed.push('q1'), 1);
    only.seat({ uid: 64055, preferred: false }, () => closed.push('q2'), 2);
    expect(only.makeRoomForQemu()).toBe(false);
    expect(only.makeRoomFor(5)).toBe(false);
    expect(closed).toEqual(['served 0']);
    qemu.release();
    expect(s.qemuFirst(4242)).toBe(true);
  });
});
