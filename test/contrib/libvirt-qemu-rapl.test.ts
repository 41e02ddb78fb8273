/**
 * contrib/libvirt/qemu-rapl, the <emulator> wrapper that gives a libvirt domain QEMU's rapl=true: it
 * passes every argument libvirt gives through unchanged, in order, but turns `-accel kvm` into
 * `-accel kvm,rapl=true,rapl-helper-socket=SOCKET` (arguments with spaces, quotes or an empty one
 * included); and with the real QEMU, the option reaches QEMU, which on a host that is not Intel
 * refuses it with its vendor check's own words (so it was read, where a second -accel is not).
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { hasKvm, missing } from '../support/env.js';

const WRAPPER = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../contrib/libvirt/qemu-rapl');
const RAPL = 'kvm,rapl=true,rapl-helper-socket=/run/qemu-vmsr-helper.sock';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});

/** A copy of the wrapper whose QEMU is `qemu` (as an operator edits the copy they install). */
function wrapperRunning(qemu: string): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-qemu-rapl-'));
  dirs.push(dir);
  const copy = path.join(dir, 'qemu-rapl');
  const text = fs.readFileSync(WRAPPER, 'utf8');
  expect(text).toMatch(/^QEMU=\/usr\/bin\/qemu-system-x86_64$/m);
  fs.writeFileSync(copy, text.replace(/^QEMU=.*$/m, `QEMU=${qemu}`), { mode: 0o755 });
  return copy;
}

describe('the libvirt emulator wrapper for rapl=true', () => {
  it('passes libvirt-like command lines through unchanged but for -accel kvm, for each place and shape of argument', () => {
    const printer = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-argv-')), 'argv');
    dirs.push(path.dirname(printer));
    fs.writeFileSync(printer, '#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done\n', { mode: 0o755 });
    const wrapper = wrapperRunning(printer);
    const cases: string[][] = [
      ['-name', 'guest=web,debug-threads=on', '-machine', 'pc-q35-10.0,usb=off', '-accel', 'kvm', '-m', '1024'],
      ['-accel', 'kvm'],
      ['-accel', 'tcg'],
      ['-accel', 'kvm,kernel-irqchip=split'],
      ['-S', '-no-user-config', '-nodefaults', '-qmp', 'stdio'],
      ['-name', 'with space', '', "it's", '-accel', 'kvm', '-accel', 'kvm', 'kvm'],
      [],
    ];
    for (const args of cases) {
      const r = spawnSync(wrapper, args, { encoding: 'utf8' });
      expect(r.status, r.stderr).toBe(0);
      const got = r.stdout === '' ? [] : r.stdout.replace(/\0$/, '').split('\0');
      const want = args.map((a, i) => (a === 'kvm' && args[i - 1] === '-accel' ? RAPL : a));
      expect(got, JSON.stringify(args)).toEqual(want);
    }
  });

  it('with the real QEMU, the rapl option it adds is the one QEMU reads (refused by its Intel check on a host that is not Intel)', (ctx) => {
    const why = missing({ qemu: true });
    if (why) return ctx.skip(why);
    const intel = /^vendor_id\s*:\s*GenuineIntel$/m.test(fs.readFileSync('/proc/cpuinfo', 'utf8'));
    if (intel) return ctx.skip('an Intel host: QEMU would take rapl=true (and need a helper), not refuse it');
    if (!hasKvm()) return ctx.skip('/dev/kvm missing: QEMU stops at opening KVM, before the Intel check this test reads');
    const wrapper = wrapperRunning('qemu-system-x86_64');
    const r = spawnSync(wrapper, ['-accel', 'kvm', '-display', 'none', '-nodefaults', '-S'], { encoding: 'utf8', timeout: 30_000 });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('The RAPL feature can only be enabled on hosts with Intel CPU models');
  });
});
