/**
 * Hardening of the daemon on real processes and sockets: file descriptors (a live VM is never taken
 * for ended for lack of them), log flooding, and what a client sees when a limit is reached.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { V2Client, V2Error, type Update } from '../../src/client/v2-client.js';
import { E } from '../../src/protocol/v2/codec.js';
import { FakeHost } from '../support/fake-host.js';
import { ThreadedProcess } from '../sampler/threads.js';
import { BIN, hostArgs, LegacyClient, startHelper, tempDir, waitFor, type DaemonChild } from './support/daemon-process.js';

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
  const line = fs.readFileSync(`/proc/${pid}/limits`, 'utf8').split('\n').find((l) => l.startsWith('Max open files'))!;
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
    expect((err as V2Error).helperMessage).toMatch(/not enough file descriptors: its 30[12] threads need .*raise the helper's open-file limit \(LimitNOFILE=, ulimit -n\) or lower --max-connections/);
    // a VM that fits is registered and sampled as usual, on the same connection
    const small = await threaded(4);
    const r = await c.register({ pid: small.pid, vcpus: [{ tid: small.pid, vpkg: 0 }] });
    const updates: Update[] = [];
    const first = await c.subscribe(r.vmId, (u) => updates.push(u));
    expect(first.ended).toBe(false);
    await waitFor(() => updates.length >= 2, 'two UPDATEs');
    expect(updates.every((u) => !u.ended)).toBe(true);
  });

  test('a VM whose threads outgrow the fds is never marked ended: sampling pauses (ERROR 5) and resumes; legacy clients are served', async () => {
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
    await waitFor(() => errors.length > 0, 'the ERROR 5 notice');
    expect(errors[0]!.code).toBe(E.ENERGY_SOURCE);
    expect(errors[0]!.helperMessage).toMatch(/EMFILE/);
    // while the process has more threads than the helper has fds, QEMU's connection still works
    const legacy = await LegacyClient.connect(sock);
    cleanups.push(() => legacy.close());
    expect(await legacy.request(0x606, 0, process.pid)).toBe(0xa1003n);
    await vm.cmd('stop 250');
    const n = updates.length;
    await waitFor(() => updates.length >= n + 3, 'UPDATEs after the threads are gone');
    expect(updates.filter((u) => u.ended)).toEqual([]);
    await waitFor(() => child.stderr().includes('energy source recovered'), 'the recovery log line');
    expect(lines(child.stderr(), 'sampling failed')).toBe(1);
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
