/**
 * A look-alike (any local user's process named like QEMU, with a real VM's `-uuid` or `-name`)
 * started before the real VM had that VM's directory written with its own values, which
 * docs/security.md said never happens. A directory is bound to a VM (docs/guest.md "Which VM a
 * directory is bound to") by its name (the UUID, else the name), by its owner and group (one of
 * root's or the helper's belongs to the VMs of its group, and root's; one of another user to that
 * user's), and among those to the live one. The real daemon (root, capabilities dropped), the
 * directory root's with the VM's group, the look-alike a real process of uid nobody, started first
 * and outliving the real VM.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { StatsReader } from '../../src/client/stats-reader.js';
import { waitFor } from '../daemon/support/daemon-process.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { guestDirLines, NOBODY, notRoot, guestRoot, onCleanup, sleep, startGuestDirDaemon } from './support.js';

/** The real VM runs as uid 1 in group 1 (daemon), the group of its directory. */
const VM = { uid: 1, gid: 1 };

/**
 * The pid in `d`'s statistics file and its package zone, read in one sample. Each sample writes the
 * statistics file before the zones, so a read between the two sees the file one sample ahead of a
 * zone: reads are tried for up to 10 s (about 100 samples) for one where both agree; the last read
 * whole is returned if none does (the caller's check then shows both values).
 */
function written(d: string): { pid: bigint; zone: bigint; energy: bigint } {
  const r = StatsReader.open(fs.openSync(path.join(d, 'stats'), 'r'));
  const zoneNow = () => BigInt(fs.readFileSync(path.join(d, 'intel-rapl:0/energy_uj'), 'utf8').trim());
  try {
    let whole: { pid: bigint; zone: bigint; energy: bigint } | undefined;
    for (const end = Date.now() + 10_000; Date.now() < end;) {
      const zone = zoneNow();
      const s = r.read();
      if (zoneNow() !== zone) continue;
      whole = { pid: r.value(s, 'pid')!, zone, energy: r.values(s, 'energy')![0]! };
      if (whole.zone === whole.energy) return whole;
    }
    if (whole) return whole;
    throw new Error(`no sample of ${d} read whole in 10 s`);
  } finally {
    r.close();
  }
}

describe.each([
  ['-uuid', (id: string) => ['-uuid', id]],
  ['-name', (id: string) => ['-name', `guest=${id}`]],
])("a look-alike wearing a VM's %s, started before it", (_flag, args) => {
  it("never has the VM's directory written with its values, before, beside or after the real VM", { timeout: 120_000 }, async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const dir = guestRoot();
    const daemon = await startGuestDirDaemon(dir);
    const id = _flag === '-uuid' ? crypto.randomUUID() : `la-${crypto.randomBytes(4).toString('hex')}`;
    const d = path.join(dir, id);
    fs.mkdirSync(d, { mode: 0o755 });
    fs.chownSync(d, 0, VM.gid);

    const fake = await new FakeQemu({ vcpus: 1, args: args(id) }, { uid: NOBODY, gid: NOBODY }).ready();
    onCleanup(() => fake.kill());
    await fake.cmd('spin 0');
    await waitFor(
      () => guestDirLines(daemon, d).some((l) => l.includes(`${fake.pid} (uid ${NOBODY})`)),
      'the look-alike refused',
      daemon,
      60_000,
    );
    await sleep(1000); // 10 samples
    expect(fs.readdirSync(d), 'nothing written for the look-alike').toEqual([]);
    expect(guestDirLines(daemon, d), 'said once').toHaveLength(1);

    // The real VM, the look-alike still running: its own values, from 0.
    const real = await new FakeQemu({ vcpus: 1, args: args(id) }, VM).ready();
    onCleanup(() => real.kill());
    await real.cmd('spin 0');
    await waitFor(
      () => fs.existsSync(path.join(d, 'stats')) && fs.existsSync(path.join(d, 'intel-rapl:0/energy_uj')),
      "the real VM's tree",
      daemon,
      60_000,
    );
    await sleep(500);
    const w = written(d);
    expect(w.pid).toBe(BigInt(real.pid));
    expect(w.zone, "the zone counts the real VM's energy alone").toBe(w.energy);

    // The real VM ends, the look-alike lives on: the directory keeps the real VM's last values.
    await real.kill();
    await waitFor(
      () => daemon.stderr().includes(`"pid":${real.pid},"uid":${VM.uid}},"source":"discovered","cause":"VM ended"`),
      'the VM ended',
      daemon,
    );
    await sleep(500);
    const kept = written(d);
    await sleep(1000);
    expect(written(d)).toEqual(kept);
    expect(kept.pid).toBe(BigInt(real.pid));
  });
});
