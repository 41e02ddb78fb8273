/**
 * Every VM's guest tree and its `stats` file were 0755 / 0444: any local user read any VM's energy,
 * per-vCPU values and all, while the statistics fd gives them to root, the VM's owner and
 * --observer-group alone. The real daemon (root, every capability but CAP_SYS_RAWIO dropped) with
 * --observer-group adm, a VM's directory of root's with the VM's group, readers that are real
 * processes of other uids: the VM's user (whose QEMU's 9p or virtiofs server reads the tree with its
 * own uid), an observer (uid 2 with adm among its groups), a stranger (nobody). When a VM of another
 * user takes the directory over, the first VM's user reads it no more.
 */
import { spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { waitFor } from '../daemon/support/daemon-process.js';
import { missing } from '../support/env.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { NOBODY, notRoot, guestRoot, onCleanup, startGuestDirDaemon } from './support.js';

/** The observer group (Debian's adm, gid 4) and the VMs' group (daemon, gid 1). */
const OBSERVERS = 4;
const VM_GROUP = 1;
const FILES = ['intel-rapl:0/energy_uj', 'class/powercap/intel-rapl:0/energy_uj', 'intel-rapl:0/name', 'stats'];

/** Whether a real process of `uid` (gid `gid`, supplementary `groups`) reads `file` whole, and lists `dir`. */
function reads(who: { uid: number; gid: number; groups?: number[] }, file: string): boolean {
  const groups = who.groups?.length ? `--groups=${who.groups.join(',')}` : '--clear-groups';
  const r = spawnSync('setpriv', [`--reuid=${who.uid}`, `--regid=${who.gid}`, groups, 'cat', file], { encoding: 'latin1' });
  return r.status === 0 && r.stdout.length > 0;
}

describe("a VM's guest tree", () => {
  it(
    "is read by its VM's user, its QEMU and the observers, by no other user, and no more by the VM's user once another user's VM has it",
    { timeout: 120_000 },
    async (ctx) => {
      const why = notRoot() ?? missing({ command: 'setpriv' });
      if (why) return ctx.skip(why);
      const dir = guestRoot();
      const daemon = await startGuestDirDaemon(dir, ['--observer-group', String(OBSERVERS)]);
      const uuid = crypto.randomUUID();
      const d = path.join(dir, uuid);
      fs.mkdirSync(d, { mode: 0o755 });
      fs.chownSync(d, 0, VM_GROUP);

      const first = { uid: 1, gid: VM_GROUP };
      const qemu = await new FakeQemu({ vcpus: 1, args: ['-uuid', uuid] }, first).ready();
      onCleanup(() => qemu.kill());
      await qemu.cmd('spin 0');
      await waitFor(() => FILES.every((f) => fs.existsSync(path.join(d, f))), 'the tree', daemon, 60_000);
      const observer = { uid: 2, gid: 2, groups: [OBSERVERS] };
      const stranger = { uid: NOBODY, gid: NOBODY };
      // A user of the VM's group that is not its user: the group binds the directory, it does not read it.
      const groupmate = { uid: 3, gid: VM_GROUP };
      for (const f of FILES) {
        const file = path.join(d, f);
        expect(reads(first, file), `the VM's user reads ${f}`).toBe(true);
        expect(reads(observer, file), `an observer reads ${f}`).toBe(true);
        expect(reads(stranger, file), `a stranger reads ${f}`).toBe(false);
        expect(reads(groupmate, file), `a user of the VM's group reads ${f}`).toBe(false);
      }
      expect(spawnSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', 'ls', d]).status, 'a stranger lists it').not.toBe(0);

      // The VM ends; a VM of another user of the group starts with its UUID and takes the directory.
      await qemu.kill();
      const second = { uid: 3, gid: VM_GROUP };
      const next = await new FakeQemu({ vcpus: 1, args: ['-uuid', uuid] }, second).ready();
      onCleanup(() => next.kill());
      await next.cmd('spin 0');
      const zone = path.join(d, 'intel-rapl:0/energy_uj');
      await waitFor(() => reads(second, zone), "the second VM's user reading it", daemon, 60_000);
      expect(reads(first, zone), "the first VM's user reads it").toBe(false);
      expect(reads(observer, zone)).toBe(true);
      expect(reads(stranger, zone)).toBe(false);
    },
  );
});
