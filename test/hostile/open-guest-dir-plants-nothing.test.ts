/**
 * A VM directory others can write (mode 0777, as docs/guest.md once allowed for a directory of the
 * VM's user): any local user planted a zone there, `intel-rapl:0/energy_uj` of their own values,
 * `class/powercap` linking to it and a `stats` file, and the guest read them as the helper's (the
 * helper refused the directory and left them in place). The real daemon, root with every capability
 * but CAP_SYS_RAWIO dropped; the planter a real process of another uid; the directory the helper's
 * own (root's) or the VM user's.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { StatsReader } from '../../src/client/stats-reader.js';
import { waitFor } from '../daemon/support/daemon-process.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { guestDirLines, NOBODY, notRoot, guestRoot, onCleanup, sleep, startGuestDirDaemon } from './support.js';

/** The planter: uid 1 (`daemon`), neither the helper, nor the VM's user, nor root. */
const PLANTER = 1;
const PLANTED = ['intel-rapl:0', 'class', 'stats'];

/** A whole fake tree planted in `d` by `uid`, each entry made by a real process of that uid. */
function plant(d: string, uid: number): void {
  const script = [
    'mkdir -p "$1/intel-rapl:0" "$1/class/powercap"',
    'echo package-0 > "$1/intel-rapl:0/name"',
    'echo 999999999999 > "$1/intel-rapl:0/energy_uj"',
    'ln -s ../../intel-rapl:0 "$1/class/powercap/intel-rapl:0"',
    'echo planted > "$1/stats"',
  ].join(' && ');
  execFileSync('sh', ['-c', script, 'plant', d], { uid, gid: uid });
}

/** Whether `uid` can make an entry in `d` (a real process of that uid tries). */
const canWrite = (d: string, uid: number) => spawnSync('sh', ['-c', 'touch "$1/x"', 'w', d], { uid, gid: uid }).status === 0;

describe('a VM directory others can write', () => {
  it(
    "is made the helper's own when it is the helper's: the planted tree moved aside, no one else can write it, the VM's own tree written",
    { timeout: 120_000 },
    async (ctx) => {
      const why = notRoot();
      if (why) return ctx.skip(why);
      const dir = guestRoot();
      const uuid = crypto.randomUUID();
      const d = path.join(dir, uuid);
      fs.mkdirSync(d);
      fs.chmodSync(d, 0o777);
      plant(d, PLANTER);
      const daemon = await startGuestDirDaemon(dir);
      const qemu = await new FakeQemu({ vcpus: 1, args: ['-uuid', uuid] }).ready();
      onCleanup(() => qemu.kill());
      await qemu.cmd('spin 0');
      const zone = path.join(d, 'intel-rapl:0/energy_uj');
      await waitFor(
        // The planted zone is moved aside while this looks: a stat that finds nothing is an answer.
        () => fs.statSync(zone, { throwIfNoEntry: false })?.uid === 0 && fs.existsSync(path.join(d, 'stats')),
        "the helper's tree",
        daemon,
        60_000,
      );
      expect(fs.statSync(d).mode & 0o022, 'group and others may no longer write it').toBe(0);
      expect(canWrite(d, PLANTER)).toBe(false);
      expect(canWrite(d, NOBODY)).toBe(false);
      // The planted entries are aside, under names no reader of powercap takes for a zone.
      expect(
        fs
          .readdirSync(d)
          .filter((n) => n.startsWith('.planted-'))
          .sort(),
      ).toEqual(PLANTED.map((n) => `.planted-${n}`).sort());
      for (const n of PLANTED) expect(fs.lstatSync(path.join(d, n)).uid, `${n} is the helper's`).toBe(0);
      expect(fs.readlinkSync(path.join(d, 'class/powercap/intel-rapl:0'))).toBe('../../intel-rapl:0');
      expect(BigInt(fs.readFileSync(zone, 'utf8').trim())).toBeLessThan(999999999999n);
      const r = StatsReader.open(fs.openSync(path.join(d, 'stats'), 'r'));
      onCleanup(() => r.close());
      expect(r.value(r.read(), 'pid')).toBe(BigInt(qemu.pid));
      const said = daemon
        .stderr()
        .split('\n')
        .filter((l) => l.includes(`entries planted in ${d}`));
      expect(said, 'one line naming what was moved').toHaveLength(1);
      for (const n of PLANTED) expect(said[0]).toContain(`${n} -> .planted-${n}`);
    },
  );

  it(
    "is refused when it is the VM user's, with its planted tree moved aside and nothing of the helper's written",
    { timeout: 120_000 },
    async (ctx) => {
      const why = notRoot();
      if (why) return ctx.skip(why);
      const dir = guestRoot();
      const daemon = await startGuestDirDaemon(dir);
      const uuid = crypto.randomUUID();
      const qemu = await new FakeQemu({ vcpus: 1, args: ['-uuid', uuid] }, { uid: NOBODY, gid: NOBODY }).ready();
      onCleanup(() => qemu.kill());
      await qemu.cmd('spin 0');
      // Made whole beside DIR, then renamed in: the daemon sees it planted already.
      const stage = path.join(path.dirname(dir), uuid);
      fs.mkdirSync(stage);
      fs.chmodSync(stage, 0o777);
      fs.chownSync(stage, NOBODY, NOBODY);
      plant(stage, PLANTER);
      const d = path.join(dir, uuid);
      fs.renameSync(stage, d);
      await waitFor(() => guestDirLines(daemon, d).length > 0, 'the refusal', daemon, 60_000);
      await sleep(1500); // 15 more samples
      const lines = guestDirLines(daemon, d);
      expect(lines, 'one refusal').toHaveLength(1);
      expect(lines[0]).toContain('is writable by others than its owner (mode 777)');
      expect(fs.readdirSync(d).sort()).toEqual(PLANTED.map((n) => `.planted-${n}`).sort());
    },
  );
});
