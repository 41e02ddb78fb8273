/**
 * --guest-dir against the real daemon (child process, discovery on) on a fake host whose MSR files
 * count package, core, DRAM and PSYS energy, with fake QEMUs (python processes named like QEMU, each
 * with its own -uuid): a VM's directory gets its tree and statistics file, a second VM's directory
 * nothing of the first, an ended VM's tree keeps its values; and every hostile directory a local user
 * can make is refused with one log line and never written through.
 */
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { StatsReader } from '../../src/client/stats-reader.js';
import { V2Client } from '../../src/client/v2-client.js';
import { countingHost } from './support.js';
import { TEMP_PREFIX } from '../../src/guest-dir/tree.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { missing } from '../support/env.js';
import { hostArgs, spawnHelper, tempDir, waitFor, type DaemonChild } from '../daemon/support/daemon-process.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const NOBODY = 65534;

/** A fake host counting every domain, a daemon on it publishing into a new guest directory. */
async function guestDaemon(): Promise<{ helper: DaemonChild; dir: string; socket: string }> {
  const fake = countingHost(cleanups, 1200, 400);
  const tmp = tempDir('vmsr-guest-dir-');
  cleanups.push(() => fs.rmSync(tmp, { recursive: true, force: true }));
  const dir = path.join(tmp, 'guests');
  fs.mkdirSync(dir);
  const socket = path.join(tmp, 'h.sock');
  const helper = spawnHelper(['-k', socket, ...hostArgs(fake), '--interval', '0.1', '--guest-dir', dir]);
  cleanups.push(() => helper.stop('SIGKILL'));
  await waitFor(() => helper.stderr().includes('"msg":"Listening on'), 'the helper to listen', helper);
  return { helper, dir, socket };
}

/** A fake QEMU with a fresh -uuid (its vCPU spinning unless `idle`); its UUID is its directory's name. */
async function vm(o: { idle?: boolean; uid?: number } = {}): Promise<{ qemu: FakeQemu; uuid: string }> {
  const uuid = crypto.randomUUID();
  const spawnOpts = o.uid !== undefined ? { uid: o.uid, gid: o.uid } : {};
  const qemu = await new FakeQemu({ vcpus: 1, args: ['-name', `guest=gd-${uuid.slice(0, 8)}`, '-uuid', uuid] }, spawnOpts).ready();
  cleanups.push(() => qemu.kill());
  if (!o.idle) await qemu.cmd('spin 0');
  return { qemu, uuid };
}

const readUj = (f: string): bigint => BigInt(fs.readFileSync(f, 'utf8').trim());
const exists = (f: string) => fs.existsSync(f);
/** Every entry under `d`, relative, symlinks not followed. */
function tree(d: string, rel = ''): string[] {
  return (
    fs
      .readdirSync(path.join(d, rel), { withFileTypes: true })
      .flatMap((e) => {
        const r = rel === '' ? e.name : `${rel}/${e.name}`;
        return e.isDirectory() ? [r, ...tree(d, r)] : [r];
      })
      // A file being written (created, then renamed into place) is left out.
      .filter((r) => !path.basename(r).startsWith(TEMP_PREFIX))
      .sort()
  );
}
/** The statistics memfds of VMs held by the daemon serving `socket` (its process found by its command line). */
function vmMemfds(socket: string): string[] {
  const out: string[] = [];
  for (const pid of fs.readdirSync('/proc').filter((n) => /^\d+$/.test(n))) {
    try {
      if (!fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').includes(socket)) continue;
      for (const fd of fs.readdirSync(`/proc/${pid}/fd`)) {
        const link = fs.readlinkSync(`/proc/${pid}/fd/${fd}`);
        if (link.startsWith('/memfd:vmsr-vm-')) out.push(`${pid}/${fd} ${link}`);
      }
    } catch {
      // A process that ended meanwhile.
    }
  }
  return out;
}

/** Every value of one sample of `r`, by descriptor name (generation left out: each file counts its own). */
function sampleOf(r: StatsReader): Map<string, bigint[]> {
  const s = r.read();
  return new Map(r.layout.descriptors.filter((d) => d.name !== 'generation').map((d) => [d.name, r.values(s, d.name)!]));
}

const refusals = (h: DaemonChild, d: string) =>
  h
    .stderr()
    .split('\n')
    .filter((l) => l.includes(`cannot publish into ${d}`));

describe('--guest-dir', { timeout: 240_000 }, () => {
  it('gives each VM its own tree: package, core, DRAM and PSYS zones that grow, class/powercap, the statistics file; a second VM gets nothing of the first', async (ctx) => {
    const why = missing({ root: true });
    if (why) return ctx.skip(why);
    const { helper, dir } = await guestDaemon();
    const busy = await vm();
    const idle = await vm({ idle: true });
    const unknown = crypto.randomUUID();
    for (const u of [busy.uuid, idle.uuid, unknown]) fs.mkdirSync(path.join(dir, u));
    const a = path.join(dir, busy.uuid);
    const b = path.join(dir, idle.uuid);
    await waitFor(() => exists(path.join(a, 'stats')) && exists(path.join(b, 'stats')), 'both statistics files', helper, 60_000);
    expect(tree(a)).toEqual(
      [
        'class',
        'class/powercap',
        ...['intel-rapl:0', 'intel-rapl:0:0', 'intel-rapl:0:1', 'intel-rapl:1'].flatMap((z) => [
          `class/powercap/${z}`,
          z,
          `${z}/energy_uj`,
          `${z}/max_energy_range_uj`,
          `${z}/name`,
        ]),
        'stats',
      ].sort(),
    );
    const names = ['intel-rapl:0', 'intel-rapl:0:0', 'intel-rapl:0:1', 'intel-rapl:1'].map((z) =>
      fs.readFileSync(path.join(a, 'class/powercap', z, 'name'), 'utf8'),
    );
    expect(names).toEqual(['package-0\n', 'core\n', 'dram\n', 'psys\n']);
    expect(fs.lstatSync(path.join(a, 'class/powercap/intel-rapl:0')).isSymbolicLink()).toBe(true);
    expect(fs.statSync(path.join(a, 'intel-rapl:0/energy_uj')).mode & 0o777).toBe(0o444);

    const zones = ['intel-rapl:0', 'intel-rapl:0:0', 'intel-rapl:0:1', 'intel-rapl:1'];
    const first = zones.map((z) => readUj(path.join(a, z, 'energy_uj')));
    await new Promise((r) => setTimeout(r, 1500));
    const later = zones.map((z) => readUj(path.join(a, z, 'energy_uj')));
    zones.forEach((z, i) => expect(later[i], z).toBeGreaterThan(first[i]!));

    // Each directory's statistics file is its own VM's, and its energy is the tree's (same sample, read whole).
    const stats = (d: string) => {
      const fd = fs.openSync(path.join(d, 'stats'), 'r');
      const r = StatsReader.open(fd);
      try {
        for (;;) {
          const before = readUj(path.join(d, 'intel-rapl:0/energy_uj'));
          const v = r.read();
          const after = readUj(path.join(d, 'intel-rapl:0/energy_uj'));
          if (before === after) return { pid: Number(r.value(v, 'pid')), energy: r.values(v, 'energy')![0]!, zone: before };
        }
      } finally {
        r.close();
      }
    };
    const sa = stats(a);
    const sb = stats(b);
    expect(sa.pid).toBe(busy.qemu.pid);
    expect(sb.pid).toBe(idle.qemu.pid);
    expect(sa.energy).toBe(sa.zone);
    expect(sb.energy).toBe(sb.zone);
    expect(sa.zone).toBeGreaterThan(5n * sb.zone);
    // A directory no VM names gets nothing.
    expect(fs.readdirSync(path.join(dir, unknown))).toEqual([]);

    // An ended VM keeps its last values until its directory goes.
    await busy.qemu.kill();
    const ended = `"pid":${busy.qemu.pid},"uid":0},"source":"discovered","cause":"VM ended"`;
    await waitFor(() => helper.stderr().includes(ended), 'the VM ended', helper);
    await new Promise((r) => setTimeout(r, 500));
    const kept = zones.map((z) => readUj(path.join(a, z, 'energy_uj')));
    await new Promise((r) => setTimeout(r, 1000));
    expect(zones.map((z) => readUj(path.join(a, z, 'energy_uj')))).toEqual(kept);
    fs.rmSync(a, { recursive: true });
    await new Promise((r) => setTimeout(r, 500));
    expect(exists(a)).toBe(false);
  });

  it("keeps no memfd for a published VM until a reader asks STATS_FD, whose file then holds the guest's file's values, sample for sample, in the same layout", async (ctx) => {
    const why = missing({ root: true });
    if (why) return ctx.skip(why);
    const { helper, dir, socket } = await guestDaemon();
    const busy = await vm();
    const d = path.join(dir, busy.uuid);
    fs.mkdirSync(d);
    await waitFor(() => exists(path.join(d, 'stats')), 'the statistics file', helper, 60_000);
    // Published over several samples: the guest's file is written, and the daemon holds no file of its own for it.
    await new Promise((r) => setTimeout(r, 500));
    expect(vmMemfds(socket)).toEqual([]);

    const c = await V2Client.connect(socket);
    cleanups.push(() => c.close());
    const vmId = (await c.list()).find((v) => v.pid === busy.qemu.pid)!.hostVmId;
    const { fd } = await c.statsFd(vmId);
    const fromFd = StatsReader.open(fd);
    cleanups.push(() => fromFd.close());
    const guestFd = fs.openSync(path.join(d, 'stats'), 'r');
    const fromGuest = StatsReader.open(guestFd);
    cleanups.push(() => fromGuest.close());
    // Its own file, once the reader's copy it sent is closed.
    await waitFor(() => vmMemfds(socket).length === 1, "one memfd in the daemon: the VM's statistics file", helper);
    const own = new RegExp(`/memfd:vmsr-vm-${vmId} `);
    await waitFor(() => vmMemfds(socket).length === 1 && own.test(vmMemfds(socket)[0]!), `the one memfd to be VM ${vmId}'s`, helper);
    // The same header, id string and descriptors, byte for byte.
    const head = (f: number) => {
      const b = Buffer.alloc(fromFd.layout.dataOffset);
      fs.readSync(f, b, 0, b.length, 0);
      return b;
    };
    expect(fromGuest.layout.fileSize).toBe(fromFd.layout.fileSize);
    expect(head(guestFd).equals(head(fd))).toBe(true);
    // Both are written in the same sample: read until one sample is seen in both (a sample may fall between the reads).
    let same = 0;
    for (const deadline = Date.now() + 30_000; same < 3 && Date.now() < deadline;) {
      const g = sampleOf(fromGuest);
      const f = sampleOf(fromFd);
      if (sampleOf(fromGuest).get('sample_monotonic')![0] !== g.get('sample_monotonic')![0]) continue;
      if (f.get('sample_monotonic')![0] !== g.get('sample_monotonic')![0]) continue;
      expect(f).toEqual(g);
      same++;
      await new Promise((r) => setTimeout(r, 150));
    }
    expect(same, 'samples seen whole in both files').toBe(3);
    expect(fromFd.value(fromFd.read(), 'pid')).toBe(BigInt(busy.qemu.pid));
  });

  it('refuses every hostile directory with one log line and writes nothing through it', async (ctx) => {
    const why = missing({ root: true });
    if (why) return ctx.skip(why);
    const { helper, dir } = await guestDaemon();
    const outside = tempDir('vmsr-guest-outside-');
    cleanups.push(() => fs.rmSync(outside, { recursive: true, force: true }));
    fs.writeFileSync(path.join(outside, 'victim'), 'untouched\n');
    const cases: { name: string; plant: (d: string, uuid: string) => void }[] = [
      { name: 'a uuid directory that is a symlink', plant: (d) => fs.symlinkSync(outside, d) },
      {
        name: 'a symlink inside, where a zone goes',
        plant: (d) => {
          fs.mkdirSync(d);
          fs.symlinkSync(outside, path.join(d, 'intel-rapl:0'));
        },
      },
      {
        name: 'a hard link inside',
        plant: (d) => {
          fs.mkdirSync(d);
          fs.linkSync(path.join(outside, 'victim'), path.join(d, 'stats'));
        },
      },
      {
        name: 'a FIFO inside',
        plant: (d) => {
          fs.mkdirSync(d);
          execFileSync('mkfifo', [path.join(d, 'stats')]);
        },
      },
      {
        name: 'a device inside',
        plant: (d) => {
          fs.mkdirSync(d);
          execFileSync('mknod', [path.join(d, 'energy_uj'), 'c', '1', '3']);
        },
      },
      {
        name: "a directory owned by another user than root or the VM's",
        plant: (d) => {
          fs.mkdirSync(d, { mode: 0o777 });
          fs.chownSync(d, NOBODY, NOBODY);
        },
      },
    ];
    const vms = await Promise.all(cases.map(() => vm()));
    // Each made whole beside DIR, then renamed in: the daemon never sees it half planted.
    const stage = path.join(path.dirname(dir), 'stage');
    fs.mkdirSync(stage);
    cases.forEach((c, i) => {
      c.plant(path.join(stage, vms[i]!.uuid), vms[i]!.uuid);
      fs.renameSync(path.join(stage, vms[i]!.uuid), path.join(dir, vms[i]!.uuid));
    });
    // A control beside them: a clean directory is written (so the daemon did sample meanwhile).
    const clean = await vm();
    fs.mkdirSync(path.join(dir, clean.uuid));
    const unrefused = () => cases.filter((_, i) => refusals(helper, path.join(dir, vms[i]!.uuid)).length === 0).map((c) => c.name);
    await waitFor(() => unrefused().length === 0, 'every refusal', helper, 60_000).catch((e: Error) => {
      throw new Error(`${e.message}; not refused: ${unrefused().join('; ')}\n${helper.stderr().slice(-3000)}`);
    });
    await waitFor(() => exists(path.join(dir, clean.uuid, 'stats')), 'the clean directory written', helper, 60_000);
    await new Promise((r) => setTimeout(r, 1500)); // 15 more samples: still one line each
    cases.forEach((c, i) => {
      const d = path.join(dir, vms[i]!.uuid);
      expect(refusals(helper, d), c.name).toHaveLength(1);
      expect(exists(path.join(d, 'class')), c.name).toBe(false);
    });
    expect(fs.readdirSync(outside)).toEqual(['victim']);
    expect(fs.readFileSync(path.join(outside, 'victim'), 'utf8')).toBe('untouched\n');
    // The daemon was not stuck on the FIFO: it still samples, and the clean tree grows.
    const e0 = readUj(path.join(dir, clean.uuid, 'intel-rapl:0/energy_uj'));
    await waitFor(() => readUj(path.join(dir, clean.uuid, 'intel-rapl:0/energy_uj')) > e0, 'the clean tree to grow', helper);

    // Once the planted link is gone, the directory is written.
    const fixed = path.join(dir, vms[1]!.uuid);
    fs.unlinkSync(path.join(fixed, 'intel-rapl:0'));
    await waitFor(() => exists(path.join(fixed, 'intel-rapl:0/energy_uj')), 'the fixed directory written', helper, 60_000);
  });

  it("writes root's directory of a VM's group for that VM, and nothing for a VM of another user", async (ctx) => {
    const why = missing({ root: true });
    if (why) return ctx.skip(why);
    const { helper, dir } = await guestDaemon();
    const theirs = await vm({ uid: NOBODY });
    const mine = await vm({ uid: NOBODY });
    // Both root's (the helper's: it runs as root), one of nobody's group, one of root's.
    for (const [v, gid] of [
      [theirs, NOBODY],
      [mine, 0],
    ] as const) {
      const d = path.join(path.dirname(dir), v.uuid);
      fs.mkdirSync(d, { mode: 0o755 });
      fs.chownSync(d, 0, gid);
      fs.renameSync(d, path.join(dir, v.uuid));
    }
    await waitFor(() => exists(path.join(dir, theirs.uuid, 'intel-rapl:0/energy_uj')), "the VM group's directory written", helper, 60_000);
    await waitFor(() => refusals(helper, path.join(dir, mine.uuid)).length > 0, 'the refusal', helper, 60_000);
    expect(refusals(helper, path.join(dir, mine.uuid))[0]).toContain(`${mine.qemu.pid} (uid ${NOBODY})`);
    expect(fs.readdirSync(path.join(dir, mine.uuid))).toEqual([]);
  });
});
