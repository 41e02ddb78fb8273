/**
 * contrib/systemd against what the kernel and systemd expect, without systemd as PID 1: device
 * group names from the kernel source, the socket's access for libvirt's QEMU.
 */
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { ROOT } from './support/daemon-process.js';
import { DEFAULT_GUEST_DIR } from '../../src/guest-dir/defaults.js';

const UNIT_DIR = path.join(ROOT, 'contrib/systemd');
const KERNEL_FIXTURE = path.join(ROOT, 'test/fixtures/kernel/msr-register.c');

/** Names given to register_chrdev()/__register_chrdev() in C source: what /proc/devices lists. */
function registeredChrdevNames(source: string): Set<string> {
  const names = new Set<string>();
  for (const m of source.matchAll(/\b_{0,2}register_chrdev\s*\(([^;]*?)"([^"]+)"\s*,\s*&\w+\s*\)/g)) names.add(m[2]!);
  return names;
}

/** Values of a key in a unit file (all occurrences, comments skipped). */
function unitValues(text: string, key: string): string[] {
  return text
    .split('\n')
    .filter((l) => l.startsWith(`${key}=`))
    .map((l) => l.slice(key.length + 1).trim());
}

function services(): [string, string][] {
  return fs
    .readdirSync(UNIT_DIR)
    .filter((f) => f.endsWith('.service'))
    .map((f) => [f, fs.readFileSync(path.join(UNIT_DIR, f), 'utf8')]);
}

describe('contrib/systemd units', () => {
  test("the kernel fixture yields the msr driver's registered name, and only it", () => {
    const names = registeredChrdevNames(fs.readFileSync(KERNEL_FIXTURE, 'utf8'));
    expect([...names]).toEqual(['cpu/msr']);
    // The name the units used to have is not one: the check below would have caught it.
    expect(names.has('msr')).toBe(false);
  });

  test('every DeviceAllow= group name in the .service units is a name the kernel driver registers', () => {
    const names = registeredChrdevNames(fs.readFileSync(KERNEL_FIXTURE, 'utf8'));
    const units = services();
    expect(units.length).toBeGreaterThan(0);
    let groups = 0;
    for (const [file, text] of units) {
      for (const v of unitValues(text, 'DeviceAllow')) {
        const spec = v.split(/\s+/)[0]!;
        const m = /^(char|block)-(.+)$/.exec(spec);
        if (!m) continue; // a /dev path: systemd checks it itself
        groups++;
        expect(
          names.has(m[2]!),
          `${file}: DeviceAllow=${v}: systemd matches "${m[2]}" against /proc/devices, where the driver registers ${[...names].join(', ')}`,
        ).toBe(true);
        expect(v.split(/\s+/)[1], `${file}: DeviceAllow=${v} must be read-only`).toBe('r');
      }
    }
    expect(groups).toBeGreaterThan(0);
  });

  test('with the msr module loaded, /proc/devices lists the same name (checked when this host has it)', (ctx) => {
    const devices = fs.readFileSync('/proc/devices', 'utf8');
    if (!/^\s*202\s/m.test(devices)) return ctx.skip('msr module not loaded here (no major 202 in /proc/devices)');
    expect(devices).toMatch(/^\s*202 cpu\/msr$/m);
  });

  test("the socket lets group kvm (libvirt-qemu's group on Debian) connect and nobody else", () => {
    const text = fs.readFileSync(path.join(UNIT_DIR, 'qemu-vmsr-helper.socket'), 'utf8');
    expect(unitValues(text, 'ListenStream')).toEqual(['/run/qemu-vmsr-helper.sock']);
    expect(unitValues(text, 'SocketUser')).toEqual(['root']);
    expect(unitValues(text, 'SocketGroup')).toEqual(['kvm']);
    expect(unitValues(text, 'SocketMode')).toEqual(['0660']);
  });

  test('the service finds a copied install in /usr/local/bin or /usr/bin, and may write only its state directory', () => {
    const text = fs.readFileSync(path.join(UNIT_DIR, 'qemu-vmsr-helper.service'), 'utf8');
    expect(unitValues(text, 'ExecStart')).toEqual(['vmsr-helper']);
    const search = unitValues(text, 'ExecSearchPath').join(':').split(':');
    expect(search).toEqual(expect.arrayContaining(['/usr/local/bin', '/usr/bin']));
    expect(unitValues(text, 'ProtectSystem')).toEqual(['strict']);
    expect(unitValues(text, 'StateDirectory')).toEqual(['vmsr-helper']);
    // And --guest-dir's default, kept across stops for the libvirt hook (docs/guest.md).
    expect(unitValues(text, 'RuntimeDirectory')).toEqual([`vmsr-helper vmsr-helper/guests`]);
    expect(DEFAULT_GUEST_DIR).toBe('/run/vmsr-helper/guests');
    expect(unitValues(text, 'RuntimeDirectoryPreserve')).toEqual(['yes']);
  });
});
