/**
 * Statistics fds from the real daemon (child process, fake MSR files, real /proc): a real QEMU guest
 * the daemon discovered and a registered VM; the C reader written from docs/stats-fd.md (built with
 * gcc) agrees with StatsReader; a client at another uid (nobody) gets what the observer rules allow
 * and ERROR 2 / 3 otherwise; `vmsr-helper stats --once --json` lists what the fds hold.
 */
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { pathToFileURL } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { ResumingV2Client } from '../../src/client/resuming-client.js';
import { V2Client } from '../../src/client/v2-client.js';
import { StatsReader } from '../../src/client/stats-reader.js';
import { BIN, ROOT, tempDir, waitFor } from './support/daemon-process.js';
import { startOpenDaemon } from './support/open-daemon.js';
import { startChild, threadsOf } from '../v2/harness.js';
import { qemuMissing, startQemu } from '../support/qemu.js';
import { which } from '../support/env.js';

const NOBODY = 65534;
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function daemon(extra: string[] = []) {
  return startOpenDaemon({ packages: [0, 0], units: 1500, extra, onCleanup: (c) => cleanups.push(c) });
}

/** Runs `body` (an ES module text, given `sock`) in node as uid nobody; its stdout parsed as JSON. */
function asNobody(sock: string, body: string): unknown {
  const client = pathToFileURL(path.join(ROOT, 'dist/src/client/v2-client.js')).href;
  const reader = pathToFileURL(path.join(ROOT, 'dist/src/client/stats-reader.js')).href;
  const text = `const { V2Client } = await import(${JSON.stringify(client)}); const { StatsReader } = await import(${JSON.stringify(reader)});
    const sock = ${JSON.stringify(sock)}; const c = await V2Client.connect(sock); const out = {};
    const tryFd = async (id) => { try { const { fd } = await c.statsFd(id); const r = StatsReader.open(fd); const v = r.value(r.read(), 'pid'); r.close(); return { ok: true, pid: v === undefined ? null : Number(v) }; } catch (e) { return { ok: false, code: e.code ?? null }; } };
    ${body}
    await c.close(); process.stdout.write(JSON.stringify(out));`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', text], {
    uid: NOBODY,
    gid: NOBODY,
    encoding: 'utf8',
    timeout: 15_000,
  });
  if (r.status !== 0) throw new Error(`client as nobody failed: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

describe('statistics fds on the daemon', () => {
  it('a discovered QEMU guest: its fd shows vCPU CPU time and energy growing, and the C reader agrees with StatsReader', async (ctx) => {
    const why = qemuMissing() ?? (which('gcc') ? null : 'gcc not installed');
    if (why) return ctx.skip(why);
    const exe = path.join(tempDir('vmsr-statsfd-c-'), 'vmsr-stats-read');
    cleanups.push(() => fs.rmSync(path.dirname(exe), { recursive: true, force: true }));
    execFileSync('gcc', ['-O2', '-Wall', '-Werror', '-o', exe, path.join(ROOT, 'contrib/stats-reader/vmsr-stats-read.c')]);
    const { sock } = await daemon();
    const guest = await startQemu({ mode: 'a', smp: 2, name: 'statsfd-guest', tcg: true });
    cleanups.push(() => guest.stop());
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    let vm: number | undefined;
    for (const end = Date.now() + 15_000; vm === undefined; await new Promise((res) => setTimeout(res, 100))) {
      if (Date.now() > end) throw new Error('discovery did not list the guest');
      vm = (await c.list()).find((v) => v.pid === guest.pid && !v.ended)?.hostVmId;
    }
    // Discovery names the guest's vCPU threads as they appear: until both are known the file has one
    // vCPU, and a file whose shape changes is marked replaced (then a new STATS_FD gives the new shape).
    let r = StatsReader.open((await c.statsFd(vm!)).fd);
    for (const end = Date.now() + 15_000; r.descriptor('vcpu_energy')!.size < 2;) {
      if (Date.now() > end) throw new Error('the guest never had two vCPUs in its file');
      const old = r;
      for (let i = 0; i < 50 && old.value(old.read(), 'replaced') !== 1n; i++) await new Promise((res) => setTimeout(res, 100));
      old.close();
      r = StatsReader.open((await c.statsFd(vm!)).fd);
    }
    const reader = r;
    cleanups.push(() => reader.close());
    expect(r.layout.id).toBe(`vmsr-vm-${vm}/pid-${guest.pid}/statsfd-guest`);
    expect(r.descriptor('vcpu_energy')!.size).toBe(2);
    const first = r.read();
    const cpu0 = r.values(first, 'vcpu_cpu_time')!.reduce((a, b) => a + b, 0n);
    const e0 = r.value(first, 'energy')!;
    await waitFor(() => {
      const s = r.read();
      return r.values(s, 'vcpu_cpu_time')!.reduce((a, b) => a + b, 0n) > cpu0 + 10n && r.value(s, 'energy')! > e0;
    }, 'the guest to use CPU time and energy');
    // The C reader and StatsReader, on one sample (same generation: retried until they meet).
    for (let i = 0; ; i++) {
      const out = execFileSync(exe, [sock, String(vm)], { encoding: 'utf8' });
      const s = r.read();
      const lines = out.trim().split('\n');
      expect(lines[0]).toBe(`id ${r.layout.id}`);
      const byName = new Map(lines.slice(1).map((l) => [l.split(' ')[0]!, l.split(' ')]));
      if (byName.get('generation')![4] !== String(s.generation)) {
        if (i < 20) continue;
        throw new Error('the C reader and StatsReader never read the same sample');
      }
      for (const d of r.layout.descriptors) {
        const f = byName.get(d.name)!;
        expect(f.slice(4)).toEqual(r.values(s, d.name)!.map(String));
        expect(Number(f[3])).toBe(d.exponent);
      }
      break;
    }
  }, 60_000);

  it("a client at uid nobody gets the fd of its own VM, ERROR 3 for root's VM and ERROR 2 for the host; the observer group gets all", async () => {
    const { sock } = await daemon(['--no-discovery']);
    const mine = startChild('sleep');
    cleanups.push(() => mine.kill());
    await waitFor(() => fs.existsSync(`/proc/${mine.pid}/task`), 'the child');
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    const rootVm = (await c.register({ pid: mine.pid, vcpus: [{ tid: threadsOf(mine.pid)[0]!, vpkg: 0 }] })).vmId;
    // A process of nobody's, registered by nobody itself.
    const theirs = spawn('sleep', ['60'], { uid: NOBODY, gid: NOBODY, stdio: 'ignore' });
    cleanups.push(() => theirs.kill('SIGKILL'));
    await waitFor(() => fs.existsSync(`/proc/${theirs.pid}/task`), 'the nobody child');
    const got = asNobody(
      sock,
      `const reg = await c.register({ pid: ${theirs.pid}, vcpus: [{ tid: ${theirs.pid}, vpkg: 0 }] });
       out.own = await tryFd(reg.vmId); out.root = await tryFd(${rootVm}); out.host = await tryFd(0);`,
    ) as Record<string, { ok: boolean; pid?: number; code?: number }>;
    expect(got.own).toEqual({ ok: true, pid: theirs.pid });
    expect(got.root).toEqual({ ok: false, code: 3 });
    expect(got.host).toEqual({ ok: false, code: 2 });
  });

  it("the observer group sees every VM and the host; `vmsr-helper stats --once --json` shows the fds' values", async () => {
    const { sock } = await daemon(['--no-discovery', '--observer-group', String(NOBODY)]);
    const vmProc = startChild('spin');
    cleanups.push(() => vmProc.kill());
    await waitFor(() => fs.existsSync(`/proc/${vmProc.pid}/task`), 'the child');
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    const vmId = (await c.register({ pid: vmProc.pid, vcpus: [{ tid: threadsOf(vmProc.pid)[0]!, vpkg: 0 }] })).vmId;
    const got = asNobody(sock, `out.vm = await tryFd(${vmId}); out.host = await tryFd(0);`) as Record<string, { ok: boolean }>;
    expect(got.vm).toMatchObject({ ok: true });
    expect(got.host).toMatchObject({ ok: true });
    const r = StatsReader.open((await c.statsFd(vmId)).fd);
    cleanups.push(() => r.close());
    await waitFor(() => r.value(r.read(), 'energy')! > 0n, 'energy');
    const out = execFileSync(process.execPath, [BIN, 'stats', '-k', sock, '--once', '--json', '--vm', String(vmId)], { encoding: 'utf8' });
    const [first, ...rows] = out
      .trim()
      .split('\n')
      .map(
        (l) =>
          JSON.parse(l) as { type: string; host_vm_id: number; pid: number; energy_j: number; vcpus: unknown[]; energy_source: string },
      );
    expect(first).toMatchObject({ type: 'daemon', socket: sock, energy_source: 'msr' });
    expect(rows).toHaveLength(1);
    // energy_source: where the helper says its energy comes from (this fake host's MSR files), on every row.
    expect(rows[0]).toMatchObject({ host_vm_id: vmId, pid: vmProc.pid, energy_source: 'msr' });
    expect(rows[0]!.energy_j).toBeGreaterThan(0);
    expect(rows[0]!.vcpus).toHaveLength(1);
    const table = execFileSync(process.execPath, [BIN, 'stats', '-k', sock, '--once'], { encoding: 'utf8' });
    expect(table).toMatch(/ID\s+NAME\s+PID\s+POWER W/);
    expect(table).toContain(String(vmProc.pid));
  });

  it("`vmsr-helper stats --interval S` refreshes every S seconds, not every second (the daemon option's default), for S below and above 1", async () => {
    const { sock } = await daemon(['--no-discovery']);
    for (const s of [0.1, 2.5]) {
      const stats = spawn(process.execPath, [BIN, 'stats', '-k', sock, '--json', '--interval', String(s)], {
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      cleanups.push(() => stats.kill('SIGKILL'));
      const at: number[] = [];
      let partial = '';
      stats.stdout.on('data', (d: Buffer) => {
        const lines = (partial + d.toString()).split('\n');
        partial = lines.pop()!;
        for (const l of lines) if (l.startsWith('{"type":"daemon"')) at.push(Date.now());
      });
      const n = s < 1 ? 11 : 3;
      await waitFor(() => at.length >= n, `${n} refreshes of stats --interval ${s}`, undefined, 60_000);
      stats.kill('SIGKILL');
      const gapS = (at[n - 1]! - at[0]!) / (n - 1) / 1000;
      // A timer never fires early, so S is a floor; with the daemon's default winning, every gap was 1 s.
      if (s < 1) expect(gapS, `mean refresh gap at --interval ${s}`).toBeLessThan(0.5);
      else expect(gapS, `mean refresh gap at --interval ${s}`).toBeGreaterThanOrEqual(s - 0.05);
    }
  });

  it('`vmsr-helper stats` follows a restart in place: the same VM, its energy read from the new image growing on', async () => {
    const { sock, helper } = await daemon(['--no-discovery']);
    const vmProc = startChild('spin');
    cleanups.push(() => vmProc.kill());
    await waitFor(() => fs.existsSync(`/proc/${vmProc.pid}/task`), 'the child');
    const c = await ResumingV2Client.connect(sock);
    cleanups.push(() => c.close());
    const vmId = (await c.register({ pid: vmProc.pid, vcpus: [{ tid: threadsOf(vmProc.pid)[0]!, vpkg: 0 }] })).vmId;
    const stats = spawn(process.execPath, [BIN, 'stats', '-k', sock, '--json', '--interval', '0.2', '--vm', String(vmId)], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    cleanups.push(() => stats.kill('SIGKILL'));
    let out = '';
    stats.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const rows = () =>
      out
        .split('\n')
        .filter((l) => l.startsWith('{"type":"vm"'))
        .map((l) => JSON.parse(l) as { host_vm_id: number; energy_j: number });
    await waitFor(() => rows().length >= 3 && rows().at(-1)!.energy_j > 0, 'stats rows before the restart');
    helper.proc.kill('SIGHUP');
    await waitFor(
      () => helper.stderr().includes('"msg":"handed over:'),
      'the restart (its binary check may take 30 s on a busy host)',
      helper,
      60_000,
    );
    const before = rows().length;
    const lastBefore = rows().at(-1)!.energy_j;
    // Rows read from the new image's file: energy beyond what the old image last wrote.
    await waitFor(
      () => rows().length > before + 3 && rows().at(-1)!.energy_j > lastBefore,
      'stats rows from the new image',
      undefined,
      15_000,
    );
    const all = rows();
    expect(new Set(all.map((r) => r.host_vm_id))).toEqual(new Set([vmId]));
    for (let i = 1; i < all.length; i++) expect(all[i]!.energy_j).toBeGreaterThanOrEqual(all[i - 1]!.energy_j);
    expect(stats.exitCode).toBeNull();
  });
});
