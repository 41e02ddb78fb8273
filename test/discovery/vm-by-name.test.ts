/**
 * `vmsr-helper watch NAME|UUID|PID` and `record --vm` end to end: the real daemon (child process, fake MSR files)
 * discovers fake QEMU processes, and the real CLI finds one in LIST and OBSERVEs it: by name, by
 * UUID, by pid, as text and --json; two VMs wearing one name are an error naming both; a monitoring
 * user (uid nobody) in the observer group watches a root-owned VM, and without the group sees none.
 */
import { execFile, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { MSR_PKG_ENERGY_STATUS, MSR_RAPL_POWER_UNIT } from '../../src/msr/registers.js';
import { FakeHost } from '../support/fake-host.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { BIN, hostArgs, spawnHelper, tempDir, waitFor } from '../daemon/support/daemon-process.js';
import { startOpenDaemon } from '../daemon/support/open-daemon.js';
import { V2Client } from '../../src/client/v2-client.js';
import { isRoot, which } from '../support/env.js';
import { groupNameOf } from '../../src/os/privileges/accounts.js';
import { readTrace } from '../../src/trace/reader.js';
import { MAX_NAMES_SHOWN } from '../../src/client/find-vm.js';
import type { VmSpec } from '../../src/model/vm.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const NOBODY = 65534;
/** An existing named group (Debian's `users`, gid 100) stands for vmsr-observers: nothing to create. */
const OBSERVER_GROUP = 'users';
const OBSERVER_GID = 100;
/**
 * This run's VM name and UUID: discovery sees the whole host, where other tests (and other runs of
 * this one) may run a fake QEMU named nbvm1 or with a fixed UUID meanwhile.
 */
const NAME = `nbvm1-${process.pid}`;
/** Far above discovery's 2 intervals, for a busy host. */
const LISTED_DEADLINE_MS = 60_000;
const UUID = randomUUID();

async function daemon(extra: string[] = []): Promise<string> {
  return (await daemonOnFakeHost(extra)).sock;
}

function daemonOnFakeHost(extra: string[] = []): Promise<{ sock: string; fake: FakeHost; dir: string }> {
  return startOpenDaemon({ units: 400, extra, onCleanup: (c) => cleanups.push(c) });
}

async function fakeVm(name: string, uuid = UUID): Promise<FakeQemu> {
  const q = new FakeQemu({ vcpus: 2, args: ['-name', `guest=${name},debug-threads=on`, '-uuid', uuid, '-smp', '2,sockets=2'] });
  cleanups.push(() => q.kill());
  await q.ready();
  await q.cmd('spin 0');
  return q;
}

/** Waits until the helper lists these VMs, live (other VMs of the host may be listed too). */
async function listed(sock: string, ...vms: FakeQemu[]): Promise<void> {
  const c = await V2Client.connect(sock);
  try {
    const deadline = Date.now() + LISTED_DEADLINE_MS;
    for (;;) {
      const live = new Set((await c.list()).filter((v) => !v.ended).map((v) => v.pid));
      const missing = vms.filter((q) => !live.has(q.pid)).map((q) => q.pid);
      if (missing.length === 0) return;
      if (Date.now() > deadline)
        throw new Error(`the helper did not list pid(s) ${missing.join(', ')} within ${LISTED_DEADLINE_MS / 1000} s`);
      await new Promise((r) => setTimeout(r, 50));
    }
  } finally {
    await c.close();
  }
}

function watch(args: string[], prefix: string[] = []): Promise<{ code: number; stdout: string; stderr: string }> {
  return cli(['watch', ...args], prefix);
}

function cli(args: string[], prefix: string[] = []): Promise<{ code: number; stdout: string; stderr: string }> {
  const cmd = [...prefix, process.execPath, BIN, ...args];
  return new Promise((resolve) =>
    execFile(cmd[0]!, cmd.slice(1), { timeout: 30_000 }, (e, stdout, stderr) =>
      resolve({ code: e ? Number((e as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    ),
  );
}

describe('watch NAME|UUID|PID', { timeout: 240_000 }, () => {
  it('watch finds a discovered VM by name, UUID and pid and prints it, its header and rows when given --count', async () => {
    const sock = await daemon();
    const q = await fakeVm(NAME);
    await listed(sock, q);
    const line = new RegExp(`^VM "${NAME}" pid ${q.pid} uid 0 uuid ${UUID} discovered, 2 virtual package\\(s\\)$`);
    for (const target of [NAME, UUID.toUpperCase(), String(q.pid)]) {
      const r = await watch(['-k', sock, target, '--count', '2']);
      expect(r.stderr).toBe('');
      expect(r.code).toBe(0);
      const lines = r.stdout.trimEnd().split('\n');
      expect(lines[0]).toMatch(line);
      expect(lines[1]).toMatch(/^ +t +vpkg0 W +vpkg0 J +vpkg1 W +vpkg1 J$/);
      expect(lines).toHaveLength(4);
      // Every row has a power: the first is measured from the values OBSERVE gave, not from zero.
      for (const row of lines.slice(2)) expect(row).toMatch(/^ +\d+\.\ds +\d+\.\d\d +\d+\.\d{3} +\d+\.\d\d +\d+\.\d{3}$/);
    }
  });

  it('watch --json names the daemon, then the VM on its next line and on every update', async () => {
    const sock = await daemon();
    const q = await fakeVm(NAME);
    await listed(sock, q);
    const r = await watch(['-k', sock, NAME, '--json', '--count', '2']);
    expect(r.code).toBe(0);
    const [daemonRec, ...recs] = r.stdout
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(daemonRec).toEqual({ type: 'daemon', socket: sock, energy_source: 'msr', domains: ['package'] });
    expect(recs[0]).toEqual({
      type: 'vm',
      vm_id: expect.any(Number),
      name: NAME,
      uuid: UUID,
      pid: q.pid,
      uid: 0,
      source: 'discovered',
      nvpkg: 2,
      whole_vm_only: false,
      energy_source: 'msr',
    });
    expect(recs).toHaveLength(3);
    for (const u of recs.slice(1)) {
      expect(u).toMatchObject({ type: 'update', vm_id: recs[0]!.vm_id, name: NAME, uuid: UUID, pid: q.pid });
      expect(typeof (u.vpkgs as { power_w: unknown }[])[0]!.power_w).toBe('number');
    }
  });

  it('watch refuses a name two VMs wear, listing both with pid, uid and uuid, and then watches the one picked by pid', async () => {
    const sock = await daemon();
    const real = await fakeVm(NAME);
    // A copy wearing the real VM's name and UUID: only its pid tells it apart.
    const copy = await fakeVm(NAME);
    await listed(sock, real, copy);
    for (const target of [NAME, UUID]) {
      const r = await watch(['-k', sock, target, '--count', '1']);
      expect(r.code).toBe(1);
      expect(r.stdout).toBe('');
      expect(r.stderr).toContain(`vmsr-helper watch: cannot find the VM "${target}": 2 VMs match; pick one by its PID`);
      for (const q of [real, copy]) expect(r.stderr).toMatch(new RegExp(`\n  "${NAME}" pid ${q.pid} uid 0 uuid ${UUID} discovered\n`));
      expect(r.stderr).toMatch(/pick one by its PID \(vmsr-helper watch \d+\);/);
      // The UUIDs are the same: picking by UUID is not suggested.
      expect(r.stderr).not.toContain('or its UUID');
    }
    const one = await watch(['-k', sock, String(real.pid), '--count', '1']);
    expect(one.code).toBe(0);
    expect(one.stdout).toMatch(new RegExp(`^VM "${NAME}" pid ${real.pid} `));
  });

  it('watch of a name no VM has says so and names the VMs there are', async () => {
    const sock = await daemon();
    await listed(sock, await fakeVm(NAME));
    const r = await watch(['-k', sock, 'nbvm2']);
    expect(r.code).toBe(1);
    // Discovery is host-wide: VMs of other users and tests may be listed beside this one; past
    // MAX_NAMES_SHOWN of them, the rest are counted, this one maybe among them.
    const m =
      /cannot find the VM "nbvm2": no VM has that pid, UUID or name \(the VMs you may see are (.*?)( and \d+ more)?\); give a name/.exec(
        r.stderr,
      );
    expect(m, r.stderr).not.toBeNull();
    if (m![2] === undefined) expect(m![1]).toContain(`"${NAME}"`);
    else expect(m![1]!.split(', ')).toHaveLength(MAX_NAMES_SHOWN);
  });

  it('a monitoring user in the observer group watches a root-owned VM by name; without the group it sees none', async (ctx) => {
    if (!isRoot()) return ctx.skip('needs root: the VM runs as root and the watcher as uid nobody');
    if (!which('setpriv')) return ctx.skip('needs setpriv (util-linux) to give uid nobody a supplementary group');
    if (groupNameOf(OBSERVER_GID) !== OBSERVER_GROUP) return ctx.skip(`needs group ${OBSERVER_GROUP} with gid ${OBSERVER_GID} (Debian's)`);
    const sock = await daemon(['--observer-group', OBSERVER_GROUP]);
    await listed(sock, await fakeVm(NAME));
    const member = await watch(
      ['-k', sock, NAME, '--count', '1'],
      ['setpriv', `--reuid=${NOBODY}`, `--regid=${NOBODY}`, `--groups=${OBSERVER_GID}`, '--'],
    );
    expect(member.stderr).toBe('');
    expect(member.code).toBe(0);
    expect(member.stdout).toMatch(new RegExp(`^VM "${NAME}" pid \\d+ uid 0 `));
    const stranger = await watch(
      ['-k', sock, NAME, '--count', '1'],
      ['setpriv', `--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups', '--'],
    );
    expect(stranger.code).toBe(1);
    // Other processes of uid nobody that look like QEMU may run on this host: the stranger may see those, never nbvm1.
    expect(stranger.stderr).toContain(`cannot find the VM "${NAME}": no VM has that pid, UUID or name (the `);
    expect(stranger.stderr).not.toMatch(new RegExp(`you may see are [^)]*"${NAME}"`));
  });
});

describe('record --vm NAME|UUID|PID', { timeout: 240_000 }, () => {
  it("record --vm takes a discovered VM's pid, name and vCPU threads from the helper and this host's /proc", async () => {
    const { sock, fake, dir } = await daemonOnFakeHost();
    const q = await fakeVm(NAME);
    await listed(sock, q);
    const out = path.join(dir, 'vm.jsonl');
    const common = ['-k', sock, '--energy-source', 'synthetic', '--sys-root', fake.sysRoot, '--duration', '0.3', '--interval', '0.1'];
    const r = await cli(['record', '--vm', NAME, ...common, '-o', out]);
    expect(r.code, r.stderr).toBe(0);
    const registered: VmSpec[] = [];
    for await (const rec of readTrace(out)) if (rec.type === 'register') registered.push(rec.vm);
    expect(registered).toHaveLength(1);
    expect(registered[0]).toMatchObject({ pid: q.pid, name: NAME });
    // -smp 2,sockets=2: CPU 0/KVM in virtual package 0, CPU 1/KVM in 1.
    const expected = [0, 1].map((i) => ({ tid: q.vcpuTids.get(i)!, vpkg: i })).sort((a, b) => a.tid - b.tid);
    expect(registered[0]!.vcpus).toEqual(expected);
    // A name nobody has is the same error as watch's.
    const none = await cli(['record', '--vm', 'nbvm9', ...common, '-o', path.join(dir, 'none.jsonl')]);
    expect(none.code).toBe(1);
    expect(none.stderr).toContain('cannot find the VM "nbvm9": no VM has that pid, UUID or name');
  });

  it('watch NAME follows the VM across a restart in place: the same VM id, its energy going on, and a note saying so', async () => {
    const fake = new FakeHost();
    fake.writePackageMsr(0, MSR_RAPL_POWER_UNIT, 0xa0e03n);
    fake.writePackageMsr(0, MSR_PKG_ENERGY_STATUS, 0x1000n);
    cleanups.push(() => fake.cleanup(), fake.pumpEnergy({ units: 400, everyMs: 20 }));
    const sock = path.join(tempDir('vmsr-watch-restart-'), 'helper.sock');
    const helper = spawnHelper(['-k', sock, ...hostArgs(fake), '--interval', '0.2']);
    cleanups.push(() => helper.stop('SIGKILL'));
    await waitFor(() => helper.stderr().includes('"msg":"Listening on'), 'the helper to listen', helper);
    await listed(sock, await fakeVm(NAME));
    const w = spawn(process.execPath, [BIN, 'watch', NAME, '-k', sock, '--json'], { stdio: ['ignore', 'pipe', 'pipe'] });
    cleanups.push(() => w.kill('SIGKILL'));
    let out = '';
    let err = '';
    w.stdout.on('data', (d: Buffer) => (out += d.toString()));
    w.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const updates = () =>
      out
        .split('\n')
        .filter((l) => l.includes('"type":"update"'))
        .map((l) => JSON.parse(l) as { vm_id: number; vpkgs: { energy_uj: string }[] });
    const total = (u: { vpkgs: { energy_uj: string }[] }) => u.vpkgs.reduce((a, v) => a + BigInt(v.energy_uj), 0n);
    await waitFor(() => updates().length >= 3, 'watch rows before the restart', undefined, 90_000);
    helper.proc.kill('SIGHUP');
    await waitFor(() => helper.stderr().includes('"msg":"handed over:'), 'the restart', helper, 60_000);
    await waitFor(() => err.includes('note: the helper restarted'), 'watch to follow the restart', undefined, 60_000);
    const before = updates().length;
    await waitFor(() => updates().length >= before + 3, 'watch rows after the restart', undefined, 15_000);
    const all = updates();
    expect(new Set(all.map((u) => u.vm_id)).size).toBe(1);
    for (let i = 1; i < all.length; i++) expect(total(all[i]!)).toBeGreaterThanOrEqual(total(all[i - 1]!));
    expect(w.exitCode).toBeNull();
  });
});
