/**
 * What a restart hands over is checked before it is trusted (docs/daemon.md "Restarts"): real memfds,
 * real socket pairs and a real listening socket, the continuity record's hand-over on corrupt, cut and
 * foreign bytes.
 */
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { decodeHandover, decodeState, encodeState } from '../../src/state/snapshot-codec.js';
import { writeSealedMemfd, writeStateMemfd } from '../../src/state/memfd.js';
import { takeKept } from '../../src/helper/handover/kept.js';
import { KEPT_NAMES } from '../../src/keeper/keeper-messages.js';
import type { Handover, StateSnapshot } from '../../src/state/snapshot.js';
import { closeFd, dupCloexec } from '../../src/os/libc/fds.js';
import { memfdCreate } from '../../src/os/libc/memfd-mmap.js';
import { socketpair } from '../../src/os/libc/sockets.js';
import { isOpen } from '../support/fds.js';

const state: StateSnapshot = { nextHostVmId: 1, vms: [], packages: [], knownPids: [], lastSample: null };
const handover = (conns: Handover['connections']): Handover => ({
  writtenNs: 1000n,
  legacy: { ok: 7, refused: 1, failed: 0 },
  connections: conns,
});
const inode = (fd: number) => fs.fstatSync(fd, { bigint: true }).ino;
const RECORD = `${KEPT_NAMES.checkpointPrefix}1000`;

function logs() {
  const lines: string[] = [];
  return {
    lines,
    log: {
      info: (_o: object, m: string) => lines.push(`info ${m}`),
      warn: (o: object, m: string) => lines.push(`warn ${m} ${JSON.stringify(o)}`),
    },
  };
}

describe("the continuity record's hand-over", () => {
  test('decodes what it encoded, pending bytes included, beside the state; a checkpoint hands nothing over', () => {
    const h = handover([
      { ino: 42n, kind: 'legacy', pending: Buffer.from([1, 2, 3, 4, 5]) },
      { ino: 43n, kind: 'undecided', pending: Buffer.alloc(0) },
    ]);
    const bytes = encodeState(state, h);
    expect(decodeHandover(bytes, 2000n)).toEqual({ ok: true, value: h });
    expect(decodeState(bytes)).toEqual({ ok: true, value: state });
    expect(decodeHandover(encodeState(state), 2000n)).toEqual({ ok: true, value: null });
  });

  test('refuses corrupt, cut, foreign, future and newer-format bytes, saying why', () => {
    const b = encodeState(state, handover([{ ino: 42n, kind: 'legacy', pending: Buffer.from([1, 2, 3]) }]));
    const flipped = Buffer.from(b);
    flipped[flipped.length - 1]! ^= 1;
    const newer = Buffer.from(b);
    newer.writeUInt32LE(9, 8);
    const longer = Buffer.from(b);
    longer.writeUInt32LE(b.length, 20);
    const cases: [Buffer, RegExp][] = [
      [flipped, /checksum does not match/],
      [b.subarray(0, b.length - 2), /it is cut off/],
      [b.subarray(0, 10), /shorter than its 24-byte header/],
      [Buffer.concat([Buffer.from('VMSRHAND'), b.subarray(8)]), /does not start with VMSRSTAT/],
      [newer, /format version 9, this vmsr-helper reads versions 1, 2, 3 and 4/],
      [longer, /its hand-over of \d+ bytes is longer than its \d+-byte payload/],
    ];
    for (const [bytes, why] of cases) {
      const r = decodeHandover(bytes, 2000n);
      expect(r.ok).toBe(false);
      expect(!r.ok && r.error).toMatch(/^cannot use the handover record: /);
      expect(!r.ok && r.error).toMatch(why);
    }
    const future = decodeHandover(b, 999n);
    expect(!future.ok && future.error).toMatch(/written after now on the monotonic clock/);
    const twice = handover([
      { ino: 1n, kind: 'legacy', pending: Buffer.alloc(0) },
      { ino: 1n, kind: 'legacy', pending: Buffer.alloc(0) },
    ]);
    expect(() => encodeState(state, twice)).toThrow(/listed twice/);
  });
});

describe('what a start takes after a planned restart', () => {
  test('serves a listed connection, closes an unlisted one, a listening socket, a non-socket and an unexpected name; older records closed', async () => {
    const [a, peerA] = socketpair();
    const [b, peerB] = socketpair();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-handed-'));
    const server = net.createServer().listen(path.join(dir, 's'));
    await new Promise((r) => server.once('listening', r));
    const listening = (server as unknown as { _handle: { fd: number } })._handle.fd;
    const notSocket = fs.openSync('/dev/null', 'r');
    const recordFd = writeStateMemfd(state, handover([{ ino: inode(a), kind: 'legacy', pending: Buffer.from([9, 9]) }]));
    const older = writeStateMemfd(state);
    const stray = memfdCreate('stray');
    const { lines, log } = logs();
    try {
      const got = takeKept(
        new Map([
          [RECORD, [recordFd]],
          [`${KEPT_NAMES.checkpointPrefix}10`, [older]],
          [KEPT_NAMES.connectionPrefix, [a, b, notSocket]],
          ['vmsr-something-else', [stray]],
        ]),
        null,
        log,
        2000n,
      );
      expect(got.connections).toEqual([{ fd: a, kind: 'legacy', pending: Buffer.from([9, 9]) }]);
      expect(got.legacy).toEqual({ ok: 7, refused: 1, failed: 0 });
      expect(got.crash).toBeNull();
      expect(decodeState(got.state!)).toEqual({ ok: true, value: state });
      expect([b, notSocket, stray, recordFd, older].map(isOpen)).toEqual([false, false, false, false, false]);
      expect(lines.join('\n')).toMatch(/unexpected fds handed over as 'vmsr-something-else': closed/);
      expect(lines.join('\n')).toMatch(/the handover record does not list it/);
      expect(lines.join('\n')).toMatch(/it is not a socket/);
      expect(lines.join('\n')).toMatch(/info handed over: 1 connections/);
      // A listening socket is never taken for a connection, even when the record lists it.
      const dup = dupCloexec(listening);
      const rec2 = writeStateMemfd(state, handover([{ ino: inode(dup), kind: 'undecided', pending: Buffer.alloc(0) }]));
      const again = logs();
      const got2 = takeKept(
        new Map([
          [RECORD, [rec2]],
          [`${KEPT_NAMES.connectionPrefix}7`, [dup]],
        ]),
        null,
        again.log,
        2000n,
      );
      expect(got2.connections).toEqual([]);
      expect(isOpen(dup)).toBe(false);
      expect(again.lines.join('\n')).toMatch(/it is a listening socket, not a connection/);
    } finally {
      for (const fd of [a, peerA, peerB]) closeFd(fd);
      server.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test("an older image's hand-over (vmsr-state, vmsr-handover, vmsr-conn) restores its state and serves its connections from their next byte", () => {
    const [a, peerA] = socketpair();
    const stateFd = writeStateMemfd(state);
    const oldRecord = writeSealedMemfd('vmsr-helper-handover', Buffer.from('VMSRHAND an older record'));
    const { lines, log } = logs();
    try {
      const got = takeKept(
        new Map([
          ['vmsr-state', [stateFd]],
          ['vmsr-handover', [oldRecord]],
          ['vmsr-conn', [a]],
        ]),
        null,
        log,
        2000n,
      );
      expect(decodeState(got.state!)).toEqual({ ok: true, value: state });
      expect(got.connections).toEqual([{ fd: a, kind: 'undecided', pending: Buffer.alloc(0) }]);
      expect([stateFd, oldRecord].map(isOpen)).toEqual([false, false]);
      expect(lines.join('\n')).toMatch(/unexpected fds handed over as 'vmsr-handover': closed/);
    } finally {
      closeFd(a);
      closeFd(peerA);
    }
  });

  test('a record that is not sealed, or does not decode, is refused and logged: no state, the connections served as after a crash', () => {
    const [a, peerA] = socketpair();
    const unsealed = memfdCreate('not-sealed');
    fs.writeSync(unsealed, Buffer.from('VMSRSTAT garbage'));
    const garbage = writeSealedMemfd('vmsr-helper-state', Buffer.from('VMSRSTAT garbage'));
    try {
      for (const fd of [unsealed, garbage]) {
        const { lines, log } = logs();
        const got = takeKept(new Map([[RECORD, [fd]]]), null, log, 2000n);
        expect(isOpen(fd)).toBe(false);
        expect(got.crash).not.toBeNull();
        expect(got.state === undefined || !decodeState(got.state).ok).toBe(true);
        expect(lines.join('\n')).toMatch(fd === unsealed ? /^$/ : /handover record refused.*the snapshot is|saved state not restored/);
        if (fd === unsealed) expect(got.crash!.checkpointDropped).toMatch(/cannot restore state: the memfd has seals 0x0/);
      }
      const { log } = logs();
      const got = takeKept(new Map([[`${KEPT_NAMES.connectionPrefix}1`, [a]]]), null, log, 2000n);
      expect(got.connections).toEqual([{ fd: a, kind: 'undecided', pending: Buffer.alloc(0) }]);
    } finally {
      closeFd(a);
      closeFd(peerA);
    }
  });
});
