/**
 * A guest directory shared by libvirt, end to end: the hook (contrib/libvirt/hooks/qemu, run with
 * libvirt's arguments) makes DIR/<uuid>/, a transient domain with docs/guest.md's
 * `<filesystem type='mount' accessmode='passthrough'>` and `<readonly/>` starts with QEMU sharing it
 * read-only over 9p, the daemon (discovery on) finds the domain by its UUID and publishes its tree
 * there, and the hook removes the directory when the domain is released.
 */
import { spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeHost } from '../support/fake-host.js';
import { createDomain, ensureLibvirtd, guestKernelDir, libvirtMissing } from '../support/libvirt.js';
import { hostArgs, spawnHelper, tempDir, waitFor } from '../daemon/support/daemon-process.js';

const HOOK = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../contrib/libvirt/hooks/qemu');
const why = libvirtMissing();
if (why) console.log(`skipping the libvirt guest-directory test: ${why}`);

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe.skipIf(why !== null)('a guest directory shared by libvirt', { timeout: 240_000 }, () => {
  it("is made by the hook, shared read-only by the domain's <filesystem>, written by the daemon, and removed at release", async () => {
    await ensureLibvirtd();
    const fake = new FakeHost({ packages: [0, 0] });
    cleanups.push(() => fake.cleanup());
    cleanups.push(fake.pumpEnergy({ start: 0xfff00000, units: 5000, everyMs: 20 }));
    const tmp = tempDir('vmsr-libvirt-guest-dir-');
    fs.chmodSync(tmp, 0o755); // QEMU (libvirt-qemu) walks through it to the shared directory
    cleanups.push(() => fs.rmSync(tmp, { recursive: true, force: true }));
    const dir = path.join(tmp, 'guests');
    const helper = spawnHelper(['-k', path.join(tmp, 'h.sock'), ...hostArgs(fake), '--interval', '0.2', '--guest-dir', dir]);
    cleanups.push(() => helper.stop('SIGKILL'));
    await waitFor(() => helper.stderr().includes('"msg":"Listening on'), 'the helper to listen', helper);

    const uuid = crypto.randomUUID();
    const name = `vmsr-gd-${process.pid}`;
    const hook = (op: string, sub: string) =>
      spawnSync(HOOK, [name, op, sub, '-'], {
        input: `<domain><name>${name}</name><uuid>${uuid}</uuid></domain>\n`,
        encoding: 'utf8',
        env: { PATH: process.env.PATH, VMSR_GUEST_DIR: dir },
      });
    expect(hook('prepare', 'begin').status).toBe(0);
    const shared = path.join(dir, uuid);
    expect(fs.statSync(shared).isDirectory()).toBe(true);

    const k = guestKernelDir();
    cleanups.push(() => k.remove());
    const fsXml = `<filesystem type='mount' accessmode='passthrough'><source dir='${shared}'/><target dir='vmsr'/><readonly/></filesystem>`;
    const domain = createDomain({ name, uuid, kernel: k.kernel, dir: k.dir, mode: 'b', vcpus: 1, sockets: 1, devices: fsXml });
    cleanups.push(() => domain.destroy());
    const cmdline = fs.readFileSync(`/proc/${domain.pid}/cmdline`, 'utf8').split('\0');
    const fsdev = cmdline.find((a) => a.includes(`path=${shared}`));
    expect(fsdev, cmdline.join(' ')).toBeDefined();
    expect(fsdev).toMatch(/,readonly(=on)?(,|$)/);
    // libvirt gives the device as JSON ("mount_tag":"vmsr"), QEMU's own syntax is mount_tag=vmsr.
    expect(cmdline.some((a) => /mount_tag"?[:=]"?vmsr\b/.test(a))).toBe(true);

    await waitFor(() => fs.existsSync(path.join(shared, 'intel-rapl:0/energy_uj')), "the domain's tree", helper, 60_000);
    expect(fs.readFileSync(path.join(shared, 'intel-rapl:0/name'), 'utf8')).toBe('package-0\n');
    const e0 = BigInt(fs.readFileSync(path.join(shared, 'intel-rapl:0/energy_uj'), 'utf8').trim());
    await waitFor(
      () => BigInt(fs.readFileSync(path.join(shared, 'intel-rapl:0/energy_uj'), 'utf8').trim()) > e0,
      'the package zone to grow',
      helper,
      60_000,
    );
    // QEMU's user reads what it shares.
    const asQemu = spawnSync(
      'setpriv',
      ['--reuid=libvirt-qemu', '--regid=libvirt-qemu', '--clear-groups', 'cat', path.join(shared, 'intel-rapl:0/energy_uj')],
      {
        encoding: 'utf8',
      },
    );
    expect(asQemu.status, asQemu.stderr).toBe(0);
    expect(asQemu.stdout).toMatch(/^\d+\n$/);

    domain.destroy();
    expect(hook('release', 'end').status).toBe(0);
    expect(fs.existsSync(shared)).toBe(false);
    expect(helper.stderr()).not.toContain('cannot publish into');
  });
});
