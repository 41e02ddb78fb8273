/**
 * Hardening of the daemon on real processes and sockets: file descriptors (a live VM is never taken
 * for ended for lack of them), log flooding, and what a client sees when a limit is reached.
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { V2Error, type Update } from '../../src/client/v2-replies.js';
import { V2_MAGIC } from '../../src/protocol/legacy.js';
import { E, HEADER_SIZE, T } from '../../src/protocol/v2/codec.js';
import { getrlimit, RLIMIT_NOFILE, setrlimit } from '../../src/os/libc/processes.js';
import { FakeHost } from '../support/fake-host.js';
import { ThreadedProcess } from '../support/threads.js';
import { spawn } from 'node:child_process';
import { BIN, hostArgs, LegacyClient, spawnHelper, startHelper, tempDir, waitFor, type DaemonChild } from './support/daemon-process.js';

const cleanups: (() => void | Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function setup(): { host: FakeHost; dir: string; sock: string } {
  const host = new FakeHost();
  host.writePackageMsr(0, 0x606, 0xa1003n);
  host.writePackageMsr(0, 0x611, 0x1000n);
  const dir = tempDir('vmsr-hard-');
  cleanups.push(() => {
    host.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return { host, dir, sock: path.join(dir, 'h.sock') };
}

function track(child: DaemonChild): DaemonChild {
  cleanups.push(() => child.stop('SIGKILL'));
  return child;
}

/** The helper under a shell that sets its open-file limit first (`ulimit` arguments, e.g. ['-n', '256']). */
function withUlimit(ulimit: string[]): { command: string[] } {
  return { command: ['sh', '-c', `ulimit ${ulimit.join(' ')} && exec "$0" "$@"`, process.execPath, BIN] };
}

async function threaded(n: number): Promise<ThreadedProcess> {
  const p = new ThreadedProcess();
  cleanups.push(() => p.kill());
  await p.ready();
  if (n > 1) await p.cmd(`start ${n - 1}`);
  return p;
}

function openFileLimits(pid: number): [string, string] {
  const line = fs
    .readFileSync(`/proc/${pid}/limits`, 'utf8')
    .split('\n')
    .find((l) => l.startsWith('Max open files'))!;
  const [soft, hard] = line.replace('Max open files', '').trim().split(/\s+/);
  return [soft!, hard!];
}

function lines(text: string, needle: string): number {
  return text.split('\n').filter((l) => l.includes(needle)).length;
}

describe('file descriptors', () => {
  test('the soft open-file limit is raised to the hard limit at start-up', async () => {
    const { host, sock } = setup();
    const child = track(await startHelper(['-k', sock, ...hostArgs(host)], withUlimit(['-S', '-n', '256'])));
    const [soft, hard] = openFileLimits(child.proc.pid!);
    expect(hard).not.toBe('256');
    expect(soft).toBe(hard);
    expect(child.stderr()).toContain('"msg":"open-file limit"');
  });

  test('REGISTER is refused with ERROR 4 naming the fix when the threads would not fit the fd budget; the helper goes on', async () => {
    const { host, sock } = setup();
    const child = track(await startHelper(['-k', sock, '--interval', '0.1', ...hostArgs(host)], withUlimit(['-n', '256'])));
    const big = await threaded(301);
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    const err = await c.register({ pid: big.pid, vcpus: [{ tid: big.pid, vpkg: 0 }] }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(V2Error);
    expect((err as V2Error).code).toBe(E.LIMIT);
    expect(child.stderr()).toContain('--max-connections lowered');
    expect((err as V2Error).helperMessage).toMatch(
      /not enough file descriptors: its 30[12] threads need .*raise the helper's open-file limit \(LimitNOFILE=, ulimit -n\) or lower --max-connections/,
    );
    // a VM that fits is registered and sampled as usual, on the same connection
    const small = await threaded(4);
    const r = await c.register({ pid: small.pid, vcpus: [{ tid: small.pid, vpkg: 0 }] });
    const updates: Update[] = [];
    const first = await c.subscribe(r.vmId, (u) => updates.push(u));
    expect(first.ended).toBe(false);
    await waitFor(() => updates.length >= 2, 'two UPDATEs');
    expect(updates.every((u) => !u.ended)).toBe(true);
  });

  test('a VM whose threads outgrow the fds is sampled from the threads it keeps (NOT_WHOLE), never marked ended, and sampling goes on; legacy clients are served', async () => {
    const { host, sock } = setup();
    const child = track(await startHelper(['-k', sock, '--interval', '0.1', ...hostArgs(host)], withUlimit(['-n', '160'])));
    const vm = await threaded(8);
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    const r = await c.register({ pid: vm.pid, vcpus: [{ tid: vm.pid, vpkg: 0 }] });
    const updates: Update[] = [];
    const errors: V2Error[] = [];
    await c.subscribe(
      r.vmId,
      (u) => updates.push(u),
      (e) => errors.push(e),
    );
    await waitFor(() => updates.length >= 2, 'UPDATEs before the growth');
    await vm.cmd('start 250'); // far more threads than fds
    let flagged = false;
    for (let i = 0; i < 100 && !flagged; i++) {
      flagged = (await c.list()).find((v) => v.hostVmId === r.vmId)?.notWhole === true;
      if (!flagged) await new Promise((res) => setTimeout(res, 100));
    }
    expect(flagged).toBe(true);
    const n = updates.length;
    await waitFor(() => updates.length >= n + 3, 'UPDATEs while the process has more threads than fds');
    // while the process has more threads than the helper has fds, QEMU's connection still works
    const legacy = await LegacyClient.connect(sock);
    cleanups.push(() => legacy.close());
    expect(await legacy.request(0x606, 0, process.pid)).toBe(0xa1003n);
    await vm.cmd('stop 250');
    const m = updates.length;
    await waitFor(() => updates.length >= m + 3, 'UPDATEs after the threads are gone');
    expect(updates.filter((u) => u.ended)).toEqual([]);
    expect(errors).toEqual([]);
    expect(lines(child.stderr(), 'VM not sampled whole')).toBe(1);
    expect(lines(child.stderr(), 'sampling failed')).toBe(0);
  });
});

describe('connection cap', () => {
  test('past --max-connections a connection is closed at once, logged at most 5 times a minute; a freed slot serves again', async () => {
    const { host, sock } = setup();
    const child = track(await startHelper(['-k', sock, '--max-connections', '2', ...hostArgs(host)]));
    const a = await LegacyClient.connect(sock);
    const b = await LegacyClient.connect(sock);
    cleanups.push(() => [a, b].forEach((c) => c.close()));
    expect(await a.request(0x606, 0, process.pid)).toBe(0xa1003n);
    expect(await b.request(0x606, 0, process.pid)).toBe(0xa1003n);
    for (let i = 0; i < 10; i++) {
      const extra = await LegacyClient.connect(sock);
      await extra.whenClosed(2000);
      await expect(extra.request(0x606, 0, process.pid)).rejects.toThrow('connection closed by the helper');
    }
    await waitFor(() => lines(child.stderr(), 'connection refused: 2 connections already open') === 5, 'the refusals logged');
    expect(await a.request(0x606, 0, process.pid)).toBe(0xa1003n); // the two served ones are untouched
    b.close();
    // once the helper has seen b go, its slot serves a new client
    // (until it has, each try is refused too: on a busy machine that can take a few tries)
    let served = false;
    let refusedAfter = 0;
    for (let i = 0; i < 50 && !served; i++) {
      const c = await LegacyClient.connect(sock);
      cleanups.push(() => c.close());
      served = await c.request(0x606, 0, process.pid).then(
        (v) => v === 0xa1003n,
        () => false,
      );
      if (!served) {
        refusedAfter++;
        await new Promise((r) => setTimeout(r, 20));
      }
    }
    expect(served).toBe(true);
    expect(await child.stop()).toBe(0);
    expect(child.stderr()).toContain(`${5 + refusedAfter} more 'refused connection' messages suppressed`);
  });
});

describe('log flooding', () => {
  test('refused MSRs and failed MSR reads log at most 5 lines each, then "N more suppressed" (at shutdown at the latest)', async () => {
    const { host, sock } = setup();
    const child = track(await startHelper(['-k', sock, ...hostArgs(host)]));
    for (let i = 0; i < 30; i++) {
      const c = await LegacyClient.connect(sock);
      c.send(Buffer.from([0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])); // MSR 0x10 (TSC): not allowed
      await c.whenClosed();
    }
    const c = await LegacyClient.connect(sock);
    cleanups.push(() => c.close());
    host.writePackageMsr(0, 0x611, 0n);
    fs.truncateSync(host.msrPath(0), 0x611); // MSR 0x611 now reads short: a failed read
    for (let i = 0; i < 30; i++) expect(await c.request(0x611, 0, process.pid)).toBe(0n);
    expect(lines(child.stderr(), 'requested MSR is not allowed')).toBe(5);
    expect(lines(child.stderr(), 'MSR read failed')).toBe(5);
    expect(await child.stop()).toBe(0);
    expect(child.stderr()).toContain(`25 more 'disallowed MSR' messages suppressed`);
    expect(child.stderr()).toContain(`25 more 'failed MSR read' messages suppressed`);
  });
});

function rssMb(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m![1]) / 1024;
}

/** A raw connection (retrying EAGAIN while the listen backlog is full, as QEMU's blocking connect waits). */
async function rawConnect(sock: string): Promise<net.Socket> {
  for (let attempt = 0; ; attempt++) {
    const s = net.connect({ path: sock });
    s.on('error', () => {});
    const ok = await new Promise<boolean | Error>((resolve) => {
      s.once('connect', () => resolve(true));
      s.once('error', (e: NodeJS.ErrnoException) => resolve(e.code === 'EAGAIN' && attempt < 500 ? false : e));
    });
    if (ok === true) return s;
    s.destroy();
    if (ok instanceof Error) throw ok;
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe('memory per connection', () => {
  test('5,000 connections holding 64 KiB partial v2 frames keep RSS under 150 MB (back under 100 MB after), and a legacy client is answered throughout', async () => {
    // this test process holds 5,000 sockets too
    const lim = getrlimit(RLIMIT_NOFILE);
    if (lim.soft < 12_000) setrlimit(RLIMIT_NOFILE, { soft: Math.min(lim.hard, 20_000), hard: lim.hard });
    if (getrlimit(RLIMIT_NOFILE).soft < 12_000) throw new Error('the test needs 12,000 fds (ulimit -n)');
    const { host, sock } = setup();
    const child = track(await startHelper(['-k', sock, '--max-connections', '6000', '--frame-timeout', '300', ...hostArgs(host)]));
    const pid = child.proc.pid!;
    const baseline = rssMb(pid);

    const legacy = await LegacyClient.connect(sock);
    cleanups.push(() => legacy.close());
    let answered = 0;
    let legacyFailure: unknown = null;
    let peak = baseline;
    let running = true;
    const background = (async () => {
      while (running) {
        try {
          expect(await legacy.request(0x606, 0, process.pid)).toBe(0xa1003n);
          answered++;
        } catch (e) {
          legacyFailure = e;
          return;
        }
        peak = Math.max(peak, rssMb(pid));
        await new Promise((r) => setTimeout(r, 20));
      }
    })();

    // magic, a REGISTER header announcing 65,535 bytes, and 65,000 of them: each frame stays incomplete
    const header = Buffer.alloc(HEADER_SIZE);
    header.writeUInt16LE(T.REGISTER, 0);
    header.writeUInt32LE(65_535, 4);
    const partial = Buffer.concat([V2_MAGIC, header, Buffer.alloc(65_000, 0x55)]);
    const conns: net.Socket[] = [];
    const closedByHelper = new Set<net.Socket>();
    cleanups.push(() => conns.forEach((c) => c.destroy()));
    for (let i = 0; i < 5000; i++) {
      const c = await rawConnect(sock);
      c.on('close', () => closedByHelper.add(c));
      c.resume(); // read the ERROR and the end of the stream
      c.write(partial);
      conns.push(c);
      if (i % 250 === 0) peak = Math.max(peak, rssMb(pid));
    }
    for (let i = 0; i < 20; i++) {
      peak = Math.max(peak, rssMb(pid));
      await new Promise((r) => setTimeout(r, 100));
    }
    const held = conns.length - closedByHelper.size;
    // Frames that fit the 16 MiB budget are read and kept; the other connections wait unread (their
    // bytes stay in the kernel) instead of being read and dropped: none is closed for its frame.
    expect(peak).toBeLessThan(150);
    expect(legacyFailure).toBeNull();
    expect(held).toBeGreaterThan(4990);
    expect(child.stderr()).toContain('"cause":"reading deferred"');
    expect(lines(child.stderr(), 'this connection is read once they complete')).toBe(5); // rate-limited
    const answeredBefore = answered;

    for (const c of conns) c.destroy();
    await waitFor(() => rssMb(pid) < 100, 'RSS back under 100 MB', child, 30_000);
    await waitFor(() => child.stderr().includes('memory given back after a burst of closed connections'), 'the memory settle', child);
    await waitFor(() => answered > answeredBefore + 5, 'legacy answers after the flood');
    const late = await LegacyClient.connect(sock); // a new client is read at once again
    expect(await late.request(0x606, 0, process.pid)).toBe(0xa1003n);
    late.close();
    running = false;
    await background;
    expect(legacyFailure).toBeNull();
    console.log(
      `RSS baseline ${baseline.toFixed(0)} MB, peak ${peak.toFixed(0)} MB, after ${rssMb(pid).toFixed(0)} MB; ${held} connections held; ${answered} legacy answers`,
    );
  }, 180_000);
});

describe('incomplete frames', () => {
  test('a partial request or frame is closed at --frame-timeout (v2 gets ERROR 4), a slow sender too; idle connections are never timed out', async () => {
    const { host, sock } = setup();
    track(await startHelper(['-k', sock, '--frame-timeout', '0.5', ...hostArgs(host)]));
    const started = Date.now();
    const partialLegacy = await LegacyClient.connect(sock);
    partialLegacy.send(Buffer.from([0x06, 0x06, 0, 0, 0]));
    const partialV2 = await rawConnect(sock);
    const v2Bytes: Buffer[] = [];
    partialV2.on('data', (d: Buffer) => v2Bytes.push(d));
    const header = Buffer.alloc(HEADER_SIZE);
    header.writeUInt16LE(T.REGISTER, 0);
    header.writeUInt32LE(16, 4);
    partialV2.write(Buffer.concat([V2_MAGIC, header, Buffer.alloc(3)]));
    const v2Closed = new Promise((r) => partialV2.once('close', r));
    // a frame sent one byte every 100 ms: the deadline counts from its first byte
    const slow = await rawConnect(sock);
    const slowClosed = new Promise((r) => slow.once('close', r));
    slow.resume();
    const frame = Buffer.concat([V2_MAGIC, header, Buffer.alloc(16)]);
    let i = 0;
    const drip = setInterval(() => (i < frame.length && !slow.destroyed ? slow.write(frame.subarray(i, ++i)) : clearInterval(drip)), 100);
    cleanups.push(() => clearInterval(drip));
    const idleAfterRequest = await LegacyClient.connect(sock);
    expect(await idleAfterRequest.request(0x606, 0, process.pid)).toBe(0xa1003n);
    const idleFromStart = await LegacyClient.connect(sock);
    cleanups.push(() => [partialLegacy, idleAfterRequest, idleFromStart].forEach((c) => c.close()));

    await partialLegacy.whenClosed(3000);
    await v2Closed;
    await slowClosed;
    // Closed at the deadline (0.5 s), not once the slow sender finished (i below); far above it for a busy machine.
    expect(Date.now() - started, 'the partial ones closed at --frame-timeout 0.5').toBeLessThan(10_000);
    expect(i).toBeLessThan(frame.length); // cut off before it completed
    const reply = Buffer.concat(v2Bytes);
    expect(reply.readUInt16LE(0)).toBe(T.ERROR);
    expect(reply.readUInt32LE(HEADER_SIZE)).toBe(E.LIMIT);
    expect(reply.subarray(HEADER_SIZE + 8).toString()).toContain('frame incomplete past the deadline');
    await new Promise((r) => setTimeout(r, 1500 - (Date.now() - started)));
    expect(await idleAfterRequest.request(0x606, 0, process.pid)).toBe(0xa1003n);
    expect(await idleFromStart.request(0x606, 0, process.pid)).toBe(0xa1003n);
  });
});

describe('socket file', () => {
  test('a -k longer than sun_path is refused before anything is created', async () => {
    const { host, dir } = setup();
    const sock = path.join(dir, 'x'.repeat(120 - dir.length - 1));
    const trace = path.join(dir, 'trace.jsonl');
    const child = track(spawnHelper(['-k', sock, '--record', trace, ...hostArgs(host)]));
    expect(await child.exited).toBe(1);
    expect(child.stderr()).toContain(
      'socket path is 120 bytes, a Unix socket path holds at most 107 (sun_path is 108 bytes with its NUL); choose a shorter path',
    );
    expect(fs.readdirSync(dir)).toEqual([]); // no truncated socket, no trace
  });

  test('a -k in a missing directory says the directory does not exist', async () => {
    const { host, dir } = setup();
    const child = track(spawnHelper(['-k', path.join(dir, 'nope', 'h.sock'), ...hostArgs(host)]));
    expect(await child.exited).toBe(1);
    expect(child.stderr()).toContain(`directory ${path.join(dir, 'nope')} does not exist; create it or choose another path with -k`);
  });

  test('the socket is 0600 whatever the umask; --socket-mode and --socket-group set it explicitly', async () => {
    const { host, sock, dir } = setup();
    const loose = track(
      await startHelper(['-k', sock, ...hostArgs(host)], { command: ['sh', '-c', 'umask 000 && exec "$0" "$@"', process.execPath, BIN] }),
    );
    expect(fs.statSync(sock).mode & 0o777).toBe(0o600);
    await loose.stop();
    const sock2 = path.join(dir, 'g.sock');
    track(
      await startHelper(['-k', sock2, '--socket-mode', '0660', '--socket-group', '65534', ...hostArgs(host)], {
        command: ['sh', '-c', 'umask 000 && exec "$0" "$@"', process.execPath, BIN],
      }),
    );
    const st = fs.statSync(sock2);
    expect(st.mode & 0o777).toBe(0o660);
    expect(st.gid).toBe(65534);
    const c = await LegacyClient.connect(sock2);
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    c.close();
  });

  test('a bad --socket-mode names the fix', async () => {
    const { host, sock } = setup();
    const child = track(spawnHelper(['-k', sock, '--socket-mode', '0999', ...hostArgs(host)]));
    expect(await child.exited).toBe(1);
    expect(child.stderr()).toContain('--socket-mode: expected octal permission bits like 0600 or 0660');
  });
});

describe('after the re-exec', () => {
  test('-u nobody records (--record) into a directory only root may write: the file is created before the drop', async (ctx) => {
    if (process.getuid?.() !== 0) return ctx.skip('needs root (CI runs as root)');
    const { host, sock, dir } = setup();
    fs.chmodSync(host.dir, 0o755); // like /sys, readable by anyone
    fs.chmodSync(dir, 0o755); // root-owned: nobody may create files here
    const trace = path.join(dir, 't.jsonl');
    const child = track(await startHelper(['-k', sock, '-u', 'nobody', '--interval', '0.1', '--record', trace, ...hostArgs(host)]));
    const vm = await threaded(2);
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    const r = await c.register({ pid: vm.pid, vcpus: [{ tid: vm.pid, vpkg: 0 }] });
    const updates: Update[] = [];
    await c.subscribe(r.vmId, (u) => updates.push(u));
    await waitFor(() => updates.length >= 2, 'UPDATEs');
    expect(await child.stop()).toBe(0);
    const text = fs.readFileSync(trace, 'utf8').split('\n');
    expect(text[0]).toContain('"type":"header"');
    expect(text.some((l) => l.includes('"type":"register"'))).toBe(true);
  });
});

describe('pidfile', () => {
  test('a pidfile naming a live process that is not a vmsr-helper (pid reused) is replaced', async () => {
    const { host, sock, dir } = setup();
    const other = spawn('sleep', ['30']);
    cleanups.push(() => {
      other.kill('SIGKILL');
    });
    const pid = path.join(dir, 'h.pid');
    fs.writeFileSync(pid, `${other.pid}\n`);
    const child = track(await startHelper(['-k', sock, '-f', pid, ...hostArgs(host)]));
    expect(fs.readFileSync(pid, 'utf8').trim()).toBe(String(child.proc.pid));
  });

  test('a file that does not hold a pid is never deleted: the start is refused', async () => {
    const { host, sock, dir } = setup();
    const notes = path.join(dir, 'notes.txt');
    fs.writeFileSync(notes, 'precious notes\n');
    const child = track(spawnHelper(['-k', sock, '-f', notes, ...hostArgs(host)]));
    expect(await child.exited).toBe(1);
    expect(child.stderr()).toContain(
      `cannot use pidfile ${notes}: it exists and does not hold a pid; remove it or choose another path with -f`,
    );
    expect(fs.readFileSync(notes, 'utf8')).toBe('precious notes\n');
    expect(fs.existsSync(sock)).toBe(false);
  });

  test('a directory given to -f is a clear error', async () => {
    const { host, sock, dir } = setup();
    const child = track(spawnHelper(['-k', sock, '-f', dir, ...hostArgs(host)]));
    expect(await child.exited).toBe(1);
    expect(child.stderr()).toContain(`cannot use pidfile ${dir}: it is a directory; give a file path with -f`);
    expect(fs.statSync(dir).isDirectory()).toBe(true);
  });
});
