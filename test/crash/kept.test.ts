/**
 * The crash parts apart from the daemon (docs/daemon.md "Crashes"), on real fds: the keeper's messages
 * and environment, what a start takes from the kept fds (takeKept), and the fd store's bookkeeping
 * (outside-keep.ts) through a notify socket bound by a python3 stand-in for systemd.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  decodeKeeperMessage,
  encodeKeeperMessage,
  KEEPER_ENV,
  KEEPER_FIRST_FD,
  KEPT_NAMES,
  takeKeeperNote,
} from '../../src/keeper/keeper-messages.js';
import { takeFromKeeper } from '../../src/keeper/link.js';
import { endedFromOutside, oomKills, WATCHDOG_SILENCE_MS } from '../../src/keeper/deaths.js';
import { takeKept } from '../../src/helper/handover/kept.js';
import { outsideKeep } from '../../src/helper/handover/outside-keep.js';
import { Notifier } from '../../src/helper/lifecycle/systemd.js';
import { closeFd } from '../../src/os/libc/fds.js';
import { memfdCreate } from '../../src/os/libc/memfd-mmap.js';
import { socketpair } from '../../src/os/libc/sockets.js';
import { writeStateMemfd } from '../../src/state/memfd.js';
import { decodeState } from '../../src/state/snapshot-codec.js';
import type { StateSnapshot } from '../../src/state/snapshot.js';

const parseKeeperNote = (text: string) => takeKeeperNote({ [KEEPER_ENV.note]: text });

const snapshot = (nextHostVmId: number): StateSnapshot => ({ nextHostVmId, vms: [], packages: [], knownPids: [], lastSample: null });

function quietLog(): { warn: (o: object, m: string) => void; info: () => void; lines: string[] } {
  const lines: string[] = [];
  return { lines, warn: (_o, m) => void lines.push(m), info: () => {} };
}

describe("the keeper's messages", () => {
  it('round-trip, and anything else is refused (an unknown type, the listener message that named a path, an empty or over-long message, a bad note)', () => {
    expect(decodeKeeperMessage(encodeKeeperMessage('D', '1234'))).toEqual({ type: 'D', text: '1234' });
    expect(decodeKeeperMessage(Buffer.from('X'))).toBeNull();
    expect(decodeKeeperMessage(Buffer.from('L42:/run/h.sock')), 'no message carries a path any more').toBeNull();
    expect(decodeKeeperMessage(Buffer.alloc(0))).toBeNull();
    expect(decodeKeeperMessage(Buffer.alloc(600, 0x4c))).toBeNull();
    expect(() => encodeKeeperMessage('D', 'x'.repeat(600))).toThrow(RangeError);
    expect(parseKeeperNote('{"pid":1,"how":"SIGKILL","atMs":5,"crashes":1}')).toEqual({ pid: 1, how: 'SIGKILL', atMs: 5, crashes: 1 });
    expect(parseKeeperNote('{"pid":1,"how":"SIGKILL","atMs":5,"crashes":0,"fromOutside":true}')).toMatchObject({ fromOutside: true });
    expect(parseKeeperNote('{"pid":1,"how":"SIGKILL","atMs":5,"crashes":0,"fromOutside":"yes"}')).toBeNull();
    expect(parseKeeperNote('{"pid":"1"}')).toBeNull();
    expect(parseKeeperNote('not json')).toBeNull();
  });

  it("the names the keeper passes become named fds from fd 4 on, the start's apart (INHERIT_ENV says what they are); a name not of ours is refused with the fix", () => {
    const env: NodeJS.ProcessEnv = {
      [KEEPER_ENV.channel]: '3',
      [KEEPER_ENV.fdNames]: `${KEPT_NAMES.start}:${KEPT_NAMES.start}:${KEPT_NAMES.checkpointPrefix}0:${KEPT_NAMES.connectionPrefix}7:${KEPT_NAMES.connectionPrefix}9`,
    };
    const got = takeFromKeeper(env)!;
    expect([...got]).toEqual([
      [`${KEPT_NAMES.checkpointPrefix}0`, [KEEPER_FIRST_FD + 2]],
      [`${KEPT_NAMES.connectionPrefix}7`, [KEEPER_FIRST_FD + 3]],
      [`${KEPT_NAMES.connectionPrefix}9`, [KEEPER_FIRST_FD + 4]],
    ]);
    expect(env[KEEPER_ENV.fdNames], 'read and removed').toBeUndefined();
    expect(takeFromKeeper({})).toBeNull();
    expect(() => takeFromKeeper({ [KEEPER_ENV.channel]: '3', [KEEPER_ENV.fdNames]: 'other' })).toThrow(
      /not a kept fd's name; it is set by the keeper/,
    );
  });
});

describe('what a start takes from the kept fds', () => {
  it('after a crash: each kept connection checked (a non-socket closed, logged), the latest checkpoint read, the others closed', () => {
    const [a, b] = socketpair();
    const notSocket = memfdCreate('not-a-socket');
    const older = writeStateMemfd(snapshot(3));
    const newer = writeStateMemfd(snapshot(9));
    const log = quietLog();
    const kept = takeKept(
      new Map([
        [`${KEPT_NAMES.connectionPrefix}1`, [a]],
        [`${KEPT_NAMES.connectionPrefix}2`, [notSocket]],
        [`${KEPT_NAMES.checkpointPrefix}100`, [older]],
        [`${KEPT_NAMES.checkpointPrefix}200`, [newer]],
      ]),
      null,
      log,
    );
    expect(kept.connections.map((c) => c.fd)).toEqual([a]);
    expect(kept.connections[0]).toMatchObject({ kind: 'undecided', pending: Buffer.alloc(0) });
    expect(kept.crash).toEqual({});
    const state = decodeState(kept.state!);
    expect(state.ok && state.value.nextHostVmId).toBe(9);
    expect(kept.checkpointNames.sort()).toEqual([`${KEPT_NAMES.checkpointPrefix}100`, `${KEPT_NAMES.checkpointPrefix}200`]);
    expect(log.lines).toEqual(['kept fd is not a connection to serve: closed']);
    for (const fd of [notSocket, older, newer]) expect(isOpen(fd), `fd ${fd} closed`).toBe(false);
    closeFd(a);
    closeFd(b);
  });

  it('a checkpoint found with the restoring mark is dropped, with why', () => {
    const ckpt = writeStateMemfd(snapshot(2));
    const mark = memfdCreate('mark');
    const kept = takeKept(
      new Map([
        [`${KEPT_NAMES.checkpointPrefix}1`, [ckpt]],
        [KEPT_NAMES.restoring, [mark]],
      ]),
      null,
      quietLog(),
    );
    expect(kept.state).toBeUndefined();
    expect(kept.crash!.checkpointDropped).toBe('the process before died while restoring it');
    expect(kept.restoringMark).toBe(true);
    expect(isOpen(ckpt) || isOpen(mark)).toBe(false);
  });
});

const MANAGER = `
import socket, sys, json
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
print('ready', flush=True)
s.settimeout(2)
try:
    while True:
        msg, fds, flags, addr = socket.recv_fds(s, 4096, 16)
        print(json.dumps({'text': msg.decode(), 'fds': len(fds)}), flush=True)
except socket.timeout:
    pass
`;
import { isOpen } from '../support/fds.js';

describe("the fd store's bookkeeping", () => {
  it('stores a connection at hold and removes it by name at release; stores each checkpoint before removing the one before, and the restoring mark with it; releases nothing once detached, and stores the last record (the hand-over of a stop) even then', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-kept-'));
    const socket = path.join(dir, 'notify');
    const child = spawn('python3', ['-c', MANAGER, socket], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    await new Promise<void>((resolve) => {
      const t = setInterval(() => out.startsWith('ready\n') && (clearInterval(t), resolve()), 10);
    });
    const keep = outsideKeep(
      new Notifier({ NOTIFY_SOCKET: socket }),
      { checkpointNames: ['vmsr-ckpt-1'], restoringMark: true, crash: null },
      quietLog(),
    )!;
    expect(keep.holder).toBe('fd store');
    const [a, b] = socketpair();
    const ino = keep.held(a)!;
    expect(ino).toBe(fs.fstatSync(a, { bigint: true }).ino);
    keep.checkpoint(snapshot(4));
    keep.released(ino);
    keep.detach();
    keep.released(ino);
    keep.checkpoint(snapshot(5));
    await new Promise((r) => child.once('exit', r));
    const got = out
      .split('\n')
      .slice(1)
      .filter(Boolean)
      .map((l) => JSON.parse(l) as { text: string; fds: number });
    const name = (t: string) => /FDNAME=(\S+)/.exec(t)![1];
    expect(got.map((m) => `${m.text.split('\n')[0]} ${name(m.text)} ${m.fds}`)).toEqual([
      `FDSTORE=1 vmsr-kept-${ino} 1`,
      `FDSTORE=1 ${name(got[1]!.text)} 1`,
      'FDSTOREREMOVE=1 vmsr-ckpt-1 0',
      'FDSTOREREMOVE=1 vmsr-restoring 0',
      `FDSTOREREMOVE=1 vmsr-kept-${ino} 0`,
      `FDSTORE=1 ${name(got[5]!.text)} 1`,
      `FDSTOREREMOVE=1 ${name(got[1]!.text)} 0`,
    ]);
    expect(name(got[1]!.text)).toMatch(/^vmsr-ckpt-\d+$/);
    expect(got[1]!.text).toContain('FDPOLL=0');
    closeFd(a);
    closeFd(b);
    fs.rmSync(dir, { recursive: true, force: true });
  }, 20_000);
});

describe('how the keeper counts a death (keeper/deaths.ts)', () => {
  it('a fault, SIGABRT, a SIGKILL while the host counted an OOM kill, or a SIGALRM after a silent loop is a crash; any other signal came from outside', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-deaths-'));
    const vmstat = path.join(dir, 'vmstat');
    fs.writeFileSync(vmstat, 'pgfault 10\noom_kill 7\nother 1\n');
    expect(oomKills(vmstat)).toBe(7);
    for (const sig of ['SIGSEGV', 'SIGBUS', 'SIGILL', 'SIGFPE', 'SIGABRT', 'SIGSYS'])
      expect(endedFromOutside(sig, { oomBefore: 7, silentMs: 0 }, vmstat), sig).toBe(false);
    for (const sig of ['SIGKILL', 'SIGTERM', 'SIGUSR2', 'SIGQUIT', 'SIGALRM'])
      expect(endedFromOutside(sig, { oomBefore: 7, silentMs: 900 }, vmstat), sig).toBe(true);
    expect(
      endedFromOutside('SIGKILL', { oomBefore: 6, silentMs: 0 }, vmstat),
      'an OOM kill since the start: the OOM killer may have sent it',
    ).toBe(false);
    for (const silentMs of [WATCHDOG_SILENCE_MS, 10_000, 60_000])
      expect(endedFromOutside('SIGALRM', { oomBefore: 7, silentMs }, vmstat), `the loop silent ${silentMs} ms: its own watchdog`).toBe(
        false,
      );
    expect(endedFromOutside('SIGTERM', { oomBefore: 7, silentMs: 60_000 }, vmstat), 'silence makes only SIGALRM a crash').toBe(true);
    expect(oomKills(path.join(dir, 'missing')), 'unknown: 0').toBe(0);
    fs.rmSync(dir, { recursive: true });
  });
});
