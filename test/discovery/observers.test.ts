/**
 * Observers over v2 on a real socket: several clients watching one VM, and who may see what, with
 * clients running at another uid (nobody) and in the observer group (supplementary, via setpriv).
 * The other-uid clients run the built client library (dist/: `npm run build` first, as npm test does).
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type HostUpdate, type Update, type VmInfo, type VmUpdate } from '../../src/client/v2-replies.js';
import { E } from '../../src/protocol/v2/codec.js';
import { startChild, startHarness, until, type Harness } from '../v2/harness.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { isRoot, which } from '../support/env.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const CLIENT_JS = path.join(ROOT, 'dist/src/client/v2-client.js');
const OBSERVER_GID = 4242;
const NOBODY = 65534;

const skipWhy = !isRoot()
  ? 'needs root (children at another uid)'
  : !fs.existsSync(CLIENT_JS)
    ? `needs the build (${CLIENT_JS}): npm run build`
    : null;
if (skipWhy) console.log(`skipping observer permission tests: ${skipWhy}`);

/** Runs the client library as another user: lists, then tries OBSERVE of each id and HOST_SUBSCRIBE. */
function asOtherUser(
  h: Harness,
  cmd: string[],
  ids: number[],
): Promise<{ list: { pid: number; hostVmId: number }[]; observe: Record<string, string>; host: string }> {
  const script = path.join(h.dir, 'observer-child.mjs');
  fs.writeFileSync(
    script,
    `import { V2Client } from ${JSON.stringify(CLIENT_JS)};
const [sock, ids] = process.argv.slice(2);
const c = await V2Client.connect(sock);
const out = { list: (await c.list()).map((v) => ({ pid: v.pid, hostVmId: v.hostVmId })), observe: {}, host: '' };
for (const id of JSON.parse(ids)) {
  try { await c.observe(id, () => {}); out.observe[id] = 'ok'; } catch (e) { out.observe[id] = e.code + ' ' + e.helperMessage; }
}
try { await c.subscribeHost(() => {}); out.host = 'ok'; } catch (e) { out.host = String(e.code); }
process.stdout.write(JSON.stringify(out));
await c.close();
`,
  );
  fs.chmodSync(script, 0o644);
  return new Promise((resolve, reject) => {
    const p = spawn(cmd[0]!, [...cmd.slice(1), process.execPath, script, h.socketPath, JSON.stringify(ids)], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let o = '';
    let err = '';
    p.stdout.on('data', (d) => (o += d));
    p.stderr.on('data', (d) => (err += d));
    // Far above the child's few requests (a busy machine starts node slowly); its output says why when killed.
    const t = setTimeout(() => p.kill('SIGKILL'), 90_000);
    p.on('exit', (code) => {
      clearTimeout(t);
      code === 0
        ? resolve(JSON.parse(o))
        : reject(
            new Error(
              `observer child exited ${code} (killed after 90 s without finishing its LIST, OBSERVEs and HOST_SUBSCRIBE when null): ${err}`,
            ),
          );
    });
  });
}

/**
 * Longest wait for a VM to be listed (a scan every 100 ms finds it in well under a second; a busy
 * machine took over 10 s): far above it, below the test's own timeout.
 */
const LISTED_DEADLINE_MS = 90_000;

async function listed(c: V2Client, pid: number): Promise<VmInfo> {
  let vm: VmInfo | undefined;
  const deadline = Date.now() + LISTED_DEADLINE_MS;
  while (!(vm = (await c.list()).find((v) => v.pid === pid && !v.ended))) {
    if (Date.now() > deadline)
      throw new Error(
        `pid ${pid} not listed by LIST within ${LISTED_DEADLINE_MS / 1000} s (waited for its REGISTER or discovery to show it)`,
      );
    await new Promise((r) => setTimeout(r, 20));
  }
  return vm;
}

describe('observers', { timeout: 240_000 }, () => {
  let h: Harness;
  let pump: NodeJS.Timeout;
  const cleanup: (() => Promise<void>)[] = [];

  beforeAll(async () => {
    h = await startHarness({ intervalMs: 100, discovery: true, observerGid: OBSERVER_GID });
    pump = setInterval(() => h.addEnergy(1500), 20);
  });
  afterAll(async () => {
    clearInterval(pump);
    await h.close();
  });
  afterEach(async () => {
    for (const f of cleanup.splice(0).reverse()) await f();
  });

  it('two observers and the registering client of one VM get the same values each sample, and the end', async () => {
    const child = startChild('spin');
    cleanup.push(() => child.kill());
    const reg = await V2Client.connect(h.socketPath);
    const o1 = await V2Client.connect(h.socketPath);
    const o2 = await V2Client.connect(h.socketPath);
    cleanup.push(async () => {
      for (const c of [reg, o1, o2]) await c.close();
    });
    const r = await reg.register({ pid: child.pid, vcpus: [{ tid: child.pid, vpkg: 0 }] });
    const vm = await listed(o1, child.pid);
    expect(vm).toMatchObject({ hostVmId: r.vmId, source: 'registered', name: null });
    const seen: Map<bigint, bigint>[] = [new Map(), new Map(), new Map()];
    const ends = [false, false, false];
    const track = (i: number) => (u: Update | VmUpdate) => {
      seen[i]!.set(u.tNs, u.vpkgs[0]!.energyUj);
      if (u.ended) ends[i] = true;
    };
    await reg.subscribe(r.vmId, track(0));
    await o1.observe(r.vmId, track(1));
    await o2.observe(r.vmId, track(2));
    await until(() => seen.every((m) => m.size >= 6), 5000, 'six updates each');
    const common = [...seen[0]!.keys()].filter((t) => t > 0n && seen[1]!.has(t) && seen[2]!.has(t));
    expect(common.length).toBeGreaterThanOrEqual(4);
    for (const t of common) {
      expect(seen[1]!.get(t)).toBe(seen[0]!.get(t));
      expect(seen[2]!.get(t)).toBe(seen[0]!.get(t));
    }
    expect(seen[0]!.get(common.at(-1)!)!).toBeGreaterThan(0n);
    // The registrant leaves: the observers' VM is over (the process is not a QEMU, so not discovered).
    await reg.unregister(r.vmId);
    await until(() => ends[1] === true && ends[2] === true, 3000, 'observers told the VM ended');
    await expect(o1.observe(r.vmId, () => {})).rejects.toMatchObject({ code: E.NO_SUCH });
  });

  it.skipIf(skipWhy !== null)(
    'a peer of another uid outside the observer group sees only its own VMs; other ids look nonexistent',
    async () => {
      const root = await new FakeQemu({ vcpus: 1, args: ['-name', 'root-vm'] }).ready();
      const own = await new FakeQemu({ vcpus: 1, args: ['-name', 'nobody-vm'] }, { uid: NOBODY, gid: NOBODY }).ready();
      cleanup.push(
        () => root.kill(),
        () => own.kill(),
      );
      const c = await V2Client.connect(h.socketPath);
      cleanup.push(() => c.close());
      const rootVm = await listed(c, root.pid);
      const ownVm = await listed(c, own.pid);
      expect(ownVm.uid).toBe(NOBODY);
      const out = await asOtherUser(
        h,
        ['setpriv', `--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups'],
        [rootVm.hostVmId, ownVm.hostVmId, 999_999],
      );
      const pids = out.list.map((v) => v.pid);
      expect(pids).toContain(own.pid);
      expect(pids).not.toContain(root.pid);
      expect(out.list.every((v) => v.pid !== process.pid)).toBe(true);
      expect(out.observe[ownVm.hostVmId]).toBe('ok');
      expect(out.observe[rootVm.hostVmId]).toBe(`${E.NO_SUCH} no VM ${rootVm.hostVmId}`);
      expect(out.observe[999_999]).toBe(`${E.NO_SUCH} no VM 999999`);
      expect(out.host).toBe(String(E.NOT_PERMITTED));
    },
  );

  it.skipIf(skipWhy !== null || !which('setpriv'))(
    'a member of the observer group (supplementary group) sees every VM and the host',
    async () => {
      const root = await new FakeQemu({ vcpus: 1, args: ['-name', 'root-vm-2'] }).ready();
      cleanup.push(() => root.kill());
      const c = await V2Client.connect(h.socketPath);
      cleanup.push(() => c.close());
      const rootVm = await listed(c, root.pid);
      const out = await asOtherUser(
        h,
        ['setpriv', `--reuid=${NOBODY}`, `--regid=${NOBODY}`, `--groups=${OBSERVER_GID}`],
        [rootVm.hostVmId],
      );
      expect(out.list.map((v) => v.pid)).toContain(root.pid);
      expect(out.observe[rootVm.hostVmId]).toBe('ok');
      expect(out.host).toBe('ok');
    },
  );
});

describe('host energy', () => {
  const cleanup: (() => Promise<void>)[] = [];
  afterEach(async () => {
    for (const f of cleanup.splice(0).reverse()) await f();
  });

  it("package energy equals the VMs' energy plus the unattributed energy over the same samples", async () => {
    const a = startChild('spin');
    const b = startChild('sleep');
    cleanup.push(
      () => a.kill(),
      () => b.kill(),
    );
    // Without discovery: the VMs on the helper are exactly these two, whatever else runs here.
    const h = await startHarness({ intervalMs: 100 });
    const pump = setInterval(() => h.addEnergy(1500), 20);
    cleanup.push(async () => {
      clearInterval(pump);
      await h.close();
    });
    const c = await V2Client.connect(h.socketPath);
    cleanup.push(() => c.close());
    const host: HostUpdate[] = [];
    const vms = new Map<number, Map<bigint, bigint>>();
    for (const p of [a, b]) {
      const r = await c.register({ pid: p.pid, vcpus: [{ tid: p.pid, vpkg: 0 }] });
      const m = new Map<bigint, bigint>();
      vms.set(r.vmId, m);
      await c.subscribe(r.vmId, (u) => m.set(u.tNs, u.vpkgs[0]!.energyUj));
    }
    await c.subscribeHost((u) => host.push(u));
    // Windows between two host updates where every VM published at both ends (not its baseline sample).
    const windows = () =>
      host.slice(1).flatMap((u1, i) => {
        const u0 = host[i]!;
        if (![...vms.values()].every((m) => m.has(u0.tNs) && m.has(u1.tNs))) return [];
        const vmDelta = [...vms.values()].reduce((sum, m) => sum + Number(m.get(u1.tNs)! - m.get(u0.tNs)!), 0);
        const pkgDelta = Number(u1.packages[0]!.energyUj - u0.packages[0]!.energyUj);
        return [{ pkgDelta, vmDelta, unDelta: Number(u1.unattributedUj - u0.unattributedUj) }];
      });
    // A starved pump may add nothing between two samples (a window of no energy): waited for are
    // windows with energy, far above the second they take on an idle machine.
    await until(() => windows().filter((w) => w.pkgDelta > 0).length >= 4, 60_000, 'four windows with package energy, both VMs published');
    for (const w of windows()) {
      // floor() to whole µJ on three sides: at most a few µJ apart.
      expect(Math.abs(w.pkgDelta - w.vmDelta - w.unDelta)).toBeLessThanOrEqual(3);
    }
    expect(host.at(-1)!.stats.samples).toBeGreaterThan(host[0]!.stats.samples);
    expect(host.at(-1)!.packages[0]!.energyUj).toBeGreaterThan(host[0]!.packages[0]!.energyUj);
  });
});
