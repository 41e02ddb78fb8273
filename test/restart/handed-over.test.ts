/**
 * What a restart hands over is checked before it is trusted (docs/daemon.md "Restarts"): real memfds,
 * real socket pairs and a real listening socket, the handover record's codec on corrupt, cut and
 * foreign bytes.
 */
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { decodeHandover, encodeHandover, type HandoverRecord } from '../../src/helper/handover/handover-record.js';
import { writeSealedMemfd, writeStateMemfd } from '../../src/state/memfd.js';
import { decodeHandedState, HANDOVER_NAMES, takeHandedOver } from '../../src/helper/handover/handed-over.js';
import type { StateSnapshot } from '../../src/state/snapshot.js';
import { closeFd, dupCloexec } from '../../src/os/libc/fds.js';
import { memfdCreate } from '../../src/os/libc/memfd-mmap.js';
import { socketpair } from '../../src/os/libc/sockets.js';
import { HANDOVER_MEMFD_NAME } from '../../src/helper/handover/restarter.js';
import { isOpen } from '../support/fds.js';

const record = (conns: HandoverRecord['connections']): HandoverRecord => ({
  writtenNs: 1000n,
  legacy: { ok: 7, refused: 1, failed: 0 },
  connections: conns,
});
const inode = (fd: number) => fs.fstatSync(fd, { bigint: true }).ino;

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

describe('the handover record', () => {
  test('decodes what it encoded, pending bytes included', () => {
    const r = record([
      { ino: 42n, kind: 'legacy', pending: Buffer.from([1, 2, 3, 4, 5]) },
      { ino: 43n, kind: 'undecided', pending: Buffer.alloc(0) },
    ]);
    const back = decodeHandover(encodeHandover(r), 2000n);
    expect(back).toEqual({ ok: true, value: r });
  });

  test('refuses corrupt, cut, foreign, future and newer-format bytes, saying why', () => {
    const b = encodeHandover(record([{ ino: 42n, kind: 'legacy', pending: Buffer.from([1, 2, 3]) }]));
    const flipped = Buffer.from(b);
    flipped[flipped.length - 1]! ^= 1;
    const newer = Buffer.from(b);
    newer.writeUInt32LE(2, 8);
    const cases: [Buffer, RegExp][] = [
      [flipped, /checksum does not match/],
      [b.subarray(0, b.length - 2), /header says .* payload bytes/],
      [b.subarray(0, 10), /shorter than its 24-byte header/],
      [Buffer.concat([Buffer.from('VMSRSTAT'), b.subarray(8)]), /does not start with VMSRHAND/],
      [newer, /format version is 2, this helper reads 1/],
    ];
    for (const [bytes, why] of cases) {
      const r = decodeHandover(bytes, 2000n);
      expect(r.ok).toBe(false);
      expect(!r.ok && r.error).toMatch(/^cannot use the handover record: /);
      expect(!r.ok && r.error).toMatch(why);
    }
    const future = decodeHandover(b, 999n);
    expect(!future.ok && future.error).toMatch(/written after now on the monotonic clock/);
    expect(() =>
      encodeHandover(
        record([
          { ino: 1n, kind: 'legacy', pending: Buffer.alloc(0) },
          { ino: 1n, kind: 'legacy', pending: Buffer.alloc(0) },
        ]),
      ),
    ).toThrow(/listed twice/);
  });
});

describe('takeHandedOver', () => {
  test('serves a listed connection, closes an unlisted one, a listening socket, a non-socket and an unexpected name', async () => {
    const [a, peerA] = socketpair();
    const [b, peerB] = socketpair();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-handed-'));
    const server = net.createServer().listen(path.join(dir, 's'));
    await new Promise((r) => server.once('listening', r));
    const listening = (server as unknown as { _handle: { fd: number } })._handle.fd;
    const listeningDup = fs.openSync('/dev/null', 'r'); // any file that is not a socket
    const recordFd = writeSealedMemfd(
      HANDOVER_MEMFD_NAME,
      encodeHandover(record([{ ino: inode(a), kind: 'legacy', pending: Buffer.from([9, 9]) }])),
    );
    const stray = memfdCreate('stray');
    const { lines, log } = logs();
    try {
      const got = takeHandedOver(
        new Map([
          [HANDOVER_NAMES.record, [recordFd]],
          [HANDOVER_NAMES.connections, [a, b, listeningDup]],
          ['vmsr-something-else', [stray]],
        ]),
        log,
        2000n,
      );
      expect(got.connections).toEqual([{ fd: a, kind: 'legacy', pending: Buffer.from([9, 9]) }]);
      expect(got.legacy).toEqual({ ok: 7, refused: 1, failed: 0 });
      expect(got.state).toBeUndefined();
      expect([isOpen(b), isOpen(listeningDup), isOpen(stray), isOpen(recordFd)]).toEqual([false, false, false, false]);
      expect(lines.join('\n')).toMatch(/unexpected fds handed over as 'vmsr-something-else': closed/);
      expect(lines.join('\n')).toMatch(/the handover record does not list it/);
      expect(lines.join('\n')).toMatch(/it is not a socket/);
      // A listening socket is never taken for a connection, even when the record lists it.
      const dup = dupCloexec(listening);
      const rec2 = writeSealedMemfd(
        HANDOVER_MEMFD_NAME,
        encodeHandover(record([{ ino: inode(dup), kind: 'undecided', pending: Buffer.alloc(0) }])),
      );
      const again = logs();
      const got2 = takeHandedOver(
        new Map([
          [HANDOVER_NAMES.record, [rec2]],
          [HANDOVER_NAMES.connections, [dup]],
        ]),
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

  test('a corrupt state or record is refused and logged: no state, and the connections are closed', () => {
    const [a, peerA] = socketpair();
    const unsealed = memfdCreate('not-sealed');
    fs.writeSync(unsealed, Buffer.from('VMSRSTAT garbage'));
    const badRecord = writeSealedMemfd(HANDOVER_MEMFD_NAME, Buffer.from('VMSRHAND cut'));
    const { lines, log } = logs();
    try {
      const got = takeHandedOver(
        new Map([
          [HANDOVER_NAMES.state, [unsealed]],
          [HANDOVER_NAMES.record, [badRecord]],
          [HANDOVER_NAMES.connections, [a]],
        ]),
        log,
        2000n,
      );
      expect(got).toEqual({ connections: [] });
      expect(isOpen(a)).toBe(false);
      const text = lines.join('\n');
      expect(text).toMatch(/saved state not restored: starting fresh .*cannot restore state: the memfd has seals 0x0/);
      expect(text).toMatch(/handover record refused/);
      expect(text).toMatch(/connections handed over without a usable handover record: closed/);
    } finally {
      closeFd(peerA);
    }
  });

  test('a sealed state is taken as its bytes and decoded once asked; one that does not decode is refused then and logged', () => {
    const state: StateSnapshot = { nextHostVmId: 1, vms: [], packages: [], knownPids: [], lastSample: null };
    const good = writeStateMemfd(state);
    const garbage = writeSealedMemfd('vmsr-helper-state', Buffer.from('VMSRSTAT garbage'));
    for (const [fd, decoded, logged] of [
      [good, state, []],
      [
        garbage,
        undefined,
        [expect.stringMatching(/^warn saved state not restored: starting fresh .*cannot restore state: the snapshot is/)],
      ],
    ] as const) {
      const taken = logs();
      const got = takeHandedOver(new Map([[HANDOVER_NAMES.state, [fd]]]), taken.log, 2000n);
      expect(isOpen(fd)).toBe(false);
      expect(got.state).toBeInstanceOf(Buffer);
      expect(taken.lines.filter((l) => l.startsWith('warn'))).toEqual([]);
      const later = logs();
      expect(decodeHandedState(got.state!, later.log)).toEqual(decoded);
      expect(later.lines).toEqual(logged);
    }
  });
});
