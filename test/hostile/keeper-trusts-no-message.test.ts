/**
 * A compromised serving process against its keeper (docs/security.md "A serving
 * process that turns on its keeper"). The real keeper (runKeeper) starts a stand-in serving process
 * that sends every message kind with hostile contents over the real channel: paths in every text
 * field (the old listener message named a socket file the keeper unlinked as root), fds of the wrong
 * kind for each message (a root-only file, a listening socket, an unsealed memfd), oversized and
 * unknown messages, ten fds in one message. The keeper must keep only what each message may carry (a
 * connected stream socket, a sealed memfd), remove only the socket file the start gave it, and start
 * only its own command.
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { runKeeper } from '../../src/keeper/keeper.js';
import { ensureBuilt, tempDir } from '../daemon/support/daemon-process.js';

const LIBC = path.resolve('dist/src/os/libc');

/** The stand-in: the first start sends the hostile messages then crashes; the next reports what it was given, then crashes too. */
const STAND_IN = `
import fs from 'node:fs';
import net from 'node:net';
import { memfdCreate } from ${JSON.stringify(`${LIBC}/memfd-mmap.js`)};
import { sendFds, socketpair, SOCK_STREAM } from ${JSON.stringify(`${LIBC}/sockets.js`)};
const [victim, report] = process.argv.slice(2);
const send = (text, fds = []) => { try { sendFds(3, Buffer.from(text, 'latin1'), fds); } catch {} };
if (process.env.VMSR_HELPER_KEEPER_NOTE === undefined) {
  const file = fs.openSync(victim, 'r');
  const unsealed = memfdCreate('not-a-checkpoint');
  const server = net.createServer().listen(victim + '.sock');
  await new Promise((r) => server.once('listening', r));
  const listening = server._handle.fd;
  const [mine] = socketpair(SOCK_STREAM);
  const ino = fs.statSync(victim).ino;
  send('L' + ino + ':' + victim, [listening]);
  send('L' + ino + ':' + victim, [file]);
  send('H' + victim, [file]);
  send('H', [listening]);
  send('H', [unsealed]);
  send('H' + 'x'.repeat(600), [file]);
  send('D../../etc/passwd');
  send('D' + '9'.repeat(30));
  send('D');
  send('C' + victim, [file]);
  send('C', [unsealed]);
  send('C', [listening]);
  send('R' + victim);
  send('\\0' + victim, [file]);
  send('Z' + victim, [file]);
  send('', [file]);
  send('H', Array(10).fill(file));
  send('H', [mine]);
  send('R');
  setTimeout(() => process.exit(3), 300);
} else {
  const fds = {};
  for (const fd of fs.readdirSync('/proc/self/fd')) if (Number(fd) > 2) { try { fds[fd] = fs.readlinkSync('/proc/self/fd/' + fd); } catch {} }
  fs.writeFileSync(report, JSON.stringify({ names: process.env.VMSR_HELPER_KEEPER_FDNAMES ?? '', fds, argv: process.argv.slice(1) }));
  send('R');
  setTimeout(() => process.exit(4), 300);
}
`;

const logs: string[] = [];
const log = {
  info: (_o: object, m: string) => logs.push(m),
  warn: (_o: object, m: string) => logs.push(m),
  error: (_o: object, m: string) => logs.push(m),
};

afterEach(() => void logs.splice(0));

describe('the keeper against a hostile serving process', () => {
  test('keeps, unlinks, opens and starts nothing a serving process names when every message kind carries hostile contents', async () => {
    ensureBuilt();
    const dir = tempDir('vmsr-keeper-trust-');
    const victim = path.join(dir, 'root-file');
    fs.writeFileSync(victim, 'precious', { mode: 0o600 });
    const report = path.join(dir, 'report.json');
    const script = path.join(dir, 'stand-in.mjs');
    fs.writeFileSync(script, STAND_IN);
    // The start's own socket file: the one path the keeper may remove (after a crash loop).
    const startSock = path.join(dir, 'start.sock');
    const server = net.createServer().listen(startSock);
    await new Promise((r) => server.once('listening', r));
    const command = [process.execPath, script, victim, report];
    const code = await runKeeper({
      command,
      env: { PATH: process.env.PATH ?? '' },
      log,
      limits: { maxCrashesInARow: 2 },
      socketFile: { ino: fs.statSync(startSock).ino, path: startSock },
    });
    server.close();
    expect(fs.existsSync(report), `the second start reported what it was given (keeper's log: ${logs.join('; ')})`).toBe(true);
    const got = JSON.parse(fs.readFileSync(report, 'utf8')) as { names: string; fds: Record<string, string>; argv: string[] };
    expect(code, 'two crashes in a row stop it').toBe(1);
    // Only the one connected stream socket was kept and passed on: no file, memfd or listening socket.
    expect(got.names).toMatch(/^vmsr-kept-\d+$/);
    const sockets = Object.keys(got.fds).filter((fd) => got.fds[fd]!.startsWith('socket:'));
    expect(sockets.sort(), 'the channel and the one kept connection: the only sockets').toEqual(['3', '4']);
    expect(
      Object.values(got.fds).some((l) => l.includes(victim) || l.startsWith('/memfd:')),
      'no file or memfd passed on',
    ).toBe(false);
    expect(got.argv, 'its own command, started again').toEqual(command.slice(1));
    expect(fs.readFileSync(victim, 'utf8'), 'the file named in every message is untouched').toBe('precious');
    expect(fs.existsSync(startSock), "the start's socket file is removed after the crash loop").toBe(false);
    expect(fs.existsSync(`${victim}.sock`), "the stand-in's own socket file is not the keeper's to remove").toBe(true);
  }, 60_000);
});
