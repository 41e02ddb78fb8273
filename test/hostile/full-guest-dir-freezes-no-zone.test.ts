/**
 * A guest directory's file system filled (another user's file on a shared tmpfs, a log that grew):
 * one write failed with ENOSPC and the directory was refused for good, its zones frozen at their old
 * values after the space was back. The real daemon publishing into a real 512 KiB tmpfs, filled to
 * the last byte and then freed: while full, a zone whose value needs a new file (a reader holds its
 * spare; with VMSR_GUEST_DIR_SWAP=0, every value) and a VM directory made then (its zones, its
 * statistics file) fail and say so; once freed, both show their VM's whole energy again, nothing
 * lost and nothing refused.
 */
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { StatsReader } from '../../src/client/stats-reader.js';
import { tempDir, waitFor } from '../daemon/support/daemon-process.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { guestDirLines, notRoot, onCleanup, startGuestDirDaemon } from './support.js';

const readUj = (f: string): bigint => BigInt(fs.readFileSync(f, 'utf8').trim());

/** Bytes written into `file` until the file system is full (ENOSPC). */
function fill(file: string): number {
  const fd = fs.openSync(file, 'w');
  const chunk = Buffer.alloc(4096, 1);
  let n = 0;
  try {
    for (;;) n += fs.writeSync(fd, chunk);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOSPC') throw e;
  } finally {
    fs.closeSync(fd);
  }
  return n;
}

/** The package zone and the statistics file's energy of directory `d` read in one sample (the zone equal before and after). */
function zoneAndStats(d: string): { zone: bigint; energy: bigint } {
  const r = StatsReader.open(fs.openSync(path.join(d, 'stats'), 'r'));
  try {
    for (let i = 0; i < 1000; i++) {
      const before = readUj(path.join(d, 'intel-rapl:0/energy_uj'));
      const energy = r.values(r.read(), 'energy')![0]!;
      if (readUj(path.join(d, 'intel-rapl:0/energy_uj')) === before) return { zone: before, energy };
    }
    throw new Error(`no sample of ${d} read whole in 1000 tries`);
  } finally {
    r.close();
  }
}

describe.each([
  ['by rewriting its spare', '1'],
  ['by a new file per value (VMSR_GUEST_DIR_SWAP=0)', '0'],
])('a guest directory whose file system fills up, written %s', (_how, swap) => {
  it(
    'shows its VM its whole energy again once the space is back, and a directory made while full is written then',
    { timeout: 120_000 },
    async (ctx) => {
      const why = notRoot();
      if (why) return ctx.skip(`${why} (and to mount a tmpfs)`);
      const mnt = tempDir('vmsr-full-guest-');
      execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=512k,mode=0755', 'tmpfs', mnt]);
      onCleanup(() => {
        execFileSync('umount', ['-l', mnt]);
        fs.rmSync(mnt, { recursive: true, force: true });
      });
      const daemon = await startGuestDirDaemon(mnt, [], { ...process.env, VMSR_GUEST_DIR_SWAP: swap });
      const vms = await Promise.all(
        [0, 1].map(async () => {
          const uuid = crypto.randomUUID();
          const qemu = await new FakeQemu({ vcpus: 1, args: ['-uuid', uuid] }).ready();
          onCleanup(() => qemu.kill());
          await qemu.cmd('spin 0');
          return { uuid, qemu, dir: path.join(mnt, uuid) };
        }),
      );
      const [early, late] = vms as [(typeof vms)[0], (typeof vms)[0]];
      fs.mkdirSync(early.dir);
      const zone = path.join(early.dir, 'intel-rapl:0/energy_uj');
      await waitFor(() => fs.existsSync(zone) && fs.existsSync(path.join(early.dir, 'stats')), 'the first tree', daemon, 60_000);

      // Full: the value a reader holds is the spare at the next swap, so the next value needs a new file.
      const held = fs.openSync(zone, 'r');
      expect(fill(path.join(mnt, 'filler')), 'bytes it took to fill the tmpfs').toBeGreaterThan(0);
      fs.mkdirSync(late.dir);
      await waitFor(
        () => guestDirLines(daemon, early.dir).some((l) => l.includes('ENOSPC') || l.includes('short write')),
        `a failed write in ${early.dir} said`,
        daemon,
        60_000,
      );
      await waitFor(() => guestDirLines(daemon, late.dir).length > 0, `a failed write in ${late.dir} said`, daemon, 60_000);
      const frozen = readUj(zone);

      // Space back: both trees show their VM's whole energy (a new directory counts from 0: zone = energy).
      fs.closeSync(held);
      fs.unlinkSync(path.join(mnt, 'filler'));
      for (const v of [early, late]) {
        await waitFor(
          () => fs.existsSync(path.join(v.dir, 'stats')) && fs.existsSync(path.join(v.dir, 'intel-rapl:0/energy_uj')),
          `${v.dir}'s tree written after the space came back`,
          daemon,
          60_000,
        );
      }
      await waitFor(() => readUj(zone) > frozen, 'the held zone to move again', daemon, 60_000);
      for (const v of [early, late]) {
        const s = zoneAndStats(v.dir);
        expect(s.zone, `${v.dir}: its package zone is its VM's whole energy`).toBe(s.energy);
        expect(s.energy).toBeGreaterThan(0n);
      }
      expect(daemon.stderr()).not.toContain('nothing is written there until it is fixed');
      // Still written at every sample.
      const later = readUj(zone);
      await waitFor(() => readUj(zone) > later, 'the zone to keep moving', daemon, 30_000);
    },
  );
});
