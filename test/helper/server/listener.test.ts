/**
 * The Listener on a real Unix socket: connections waiting in the backlog are accepted up to
 * 1 + EXTRA_ACCEPTS_PER_TURN per event-loop turn (libuv alone accepts one a turn, so under load the
 * last of many new connections waited for as many turns), none is lost or delivered twice, and while
 * held (a restart) they are accepted all the same and kept unread.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import type net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { EXTRA_ACCEPTS_PER_TURN, openListener, type Listener } from '../../../src/helper/server/listener.js';
import { countTurns } from '../../support/turns.js';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A child process holding `n` connections to `socketPath`; `ready` names a file it creates once every connect() returned. */
function holdConnections(socketPath: string, n: number, ready: string): ChildProcess {
  const code = `
    const net = require('node:net'); const fs = require('node:fs');
    let left = ${n};
    for (let i = 0; i < ${n}; i++) net.connect({ path: ${JSON.stringify(socketPath)} }, () => { if (--left === 0) fs.writeFileSync(${JSON.stringify(ready)}, ''); });
    process.stdin.resume(); process.stdin.on('end', () => process.exit(0));`;
  const child = spawn(process.execPath, ['-e', code], { stdio: ['pipe', 'ignore', 'inherit'] });
  cleanups.push(() => void child.kill('SIGKILL'));
  return child;
}

/** Blocks this event loop (nothing is accepted meanwhile) until `file` exists; 20 s at most, far above the ms it takes. */
function blockUntil(file: string): void {
  const cell = new Int32Array(new SharedArrayBuffer(4));
  const end = Date.now() + 20_000;
  while (!fs.existsSync(file)) {
    if (Date.now() > end) throw new Error(`waited 20 s for the client's connections (${file})`);
    Atomics.wait(cell, 0, 0, 5);
  }
}

async function listening(): Promise<{ listener: Listener; socketPath: string; dir: string }> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-listener-'));
  const socketPath = path.join(dir, 'helper.sock');
  const listener = await openListener({ path: socketPath });
  cleanups.push(async () => {
    await listener.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return { listener, socketPath, dir };
}

/** The turn (a setImmediate count) in which each connection came, once `n` came; 20 s at most. */
async function turnsOfConnections(listener: Listener, n: number): Promise<number[]> {
  const turns: number[] = [];
  const turn = countTurns();
  const sockets: net.Socket[] = [];
  cleanups.push(() => sockets.forEach((s) => s.destroy()));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`waited 20 s for ${n} connections, got ${turns.length}`)), 20_000);
    listener.serve((s) => {
      sockets.push(s);
      turns.push(turn.now());
      if (turns.length === n) {
        clearTimeout(timer);
        resolve();
      }
    }, reject);
  });
  turn.stop();
  return turns;
}

describe('Listener', () => {
  test.each([1, EXTRA_ACCEPTS_PER_TURN, EXTRA_ACCEPTS_PER_TURN + 1, EXTRA_ACCEPTS_PER_TURN + 2, 100, 300])(
    'accepts %i waiting connections at up to 1 + EXTRA_ACCEPTS_PER_TURN a turn, each once',
    async (n) => {
      const { listener, socketPath, dir } = await listening();
      const ready = path.join(dir, 'ready');
      holdConnections(socketPath, n, ready);
      // All n wait in the backlog before this loop turns again.
      blockUntil(ready);
      const turns = await turnsOfConnections(listener, n);
      const perTurn = new Map<number, number>();
      for (const t of turns) perTurn.set(t, (perTurn.get(t) ?? 0) + 1);
      const most = Math.max(...perTurn.values());
      expect(most).toBeLessThanOrEqual(1 + EXTRA_ACCEPTS_PER_TURN);
      // One a turn (libuv's own) would take n turns; a busy machine may split a batch, never by much.
      expect(perTurn.size).toBeLessThanOrEqual(Math.ceil(n / (1 + EXTRA_ACCEPTS_PER_TURN)) + 2);
      if (n > 1) expect(most).toBeGreaterThan(1);
      // None delivered twice: no more than n arrive.
      await new Promise((r) => setTimeout(r, 100));
      expect(turns.length).toBe(n);
    },
  );

  test('holds waiting connections accepted past the first while held, and hands them on, unread, at serve()', async () => {
    const { listener, socketPath, dir } = await listening();
    const ready = path.join(dir, 'ready');
    const n = 2 * (1 + EXTRA_ACCEPTS_PER_TURN) + 5;
    holdConnections(socketPath, n, ready);
    blockUntil(ready);
    const deadline = Date.now() + 20_000;
    while (listener.heldConnections.length < n) {
      if (Date.now() > deadline) throw new Error(`waited 20 s for ${n} held connections, have ${listener.heldConnections.length}`);
      await new Promise((r) => setTimeout(r, 10));
    }
    expect(listener.heldConnections.every((s) => s.isPaused() && s.bytesRead === 0)).toBe(true);
    const turns = await turnsOfConnections(listener, n);
    expect(turns).toHaveLength(n);
    expect(new Set(turns).size).toBe(1); // all at once, from the held ones
  });
});
