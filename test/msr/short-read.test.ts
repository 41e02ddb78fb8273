/**
 * A fake MSR tree that lacks a register: the error names the register, the file, its length and what
 * the file must hold, instead of "short read (0 bytes)". Through the device, and through the real
 * daemon binary started with --vendor amd on a tree written for Intel (the case a user meets with
 * `--vendor auto` on an AMD host).
 */
import fs from 'node:fs';
import { describe, expect, test } from 'vitest';
import { FAKE_MSR_TREE_DOC, MsrDevice, MsrReadError } from '../../src/msr/device.js';
import { MSR_AMD_RAPL_POWER_UNIT, MSR_RAPL_POWER_UNIT, describeMsr } from '../../src/msr/registers.js';
import { FakeHost } from '../support/fake-host.js';
import { spawnHelper, tempDir } from '../daemon/support/daemon-process.js';

describe('short reads of a fake MSR tree', () => {
  test('a read past the end of a fake MSR file names the register, the file, its length and the doc', () => {
    const host = new FakeHost();
    const device = new MsrDevice(host.msrPathTemplate);
    try {
      host.writeRapl({ vendor: 'intel', powerUnit: 0xa0e03n });
      const size = fs.statSync(host.msrPath(0)).size;
      expect(size).toBe(MSR_RAPL_POWER_UNIT + 8);
      let err: unknown;
      try {
        device.read(0, MSR_AMD_RAPL_POWER_UNIT);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(MsrReadError);
      const m = (err as Error).message;
      expect(m).toMatch(/^cannot read MSR 0xc0010299 on CPU 0: short read \(0 bytes\): /);
      expect(m).toContain(host.msrPath(0));
      expect(m).toContain(`${size} bytes long`);
      expect(m).toContain('MSR 0xc0010299 (AMD RAPL power unit)');
      expect(m).toContain(`byte ${MSR_AMD_RAPL_POWER_UNIT + 8}`);
      expect(m).toContain(FAKE_MSR_TREE_DOC);
      // The case of a tree written for Intel read as AMD (--vendor auto on an AMD host): the fix names --vendor.
      expect(m).toContain('--vendor intel or amd');
    } finally {
      device.close();
      host.cleanup();
    }
  });

  test('a file cut inside a register says how many bytes it gave', () => {
    const host = new FakeHost();
    const device = new MsrDevice(host.msrPathTemplate);
    try {
      host.writeRapl({ vendor: 'intel', powerUnit: 0xa0e03n });
      fs.truncateSync(host.msrPath(1), MSR_RAPL_POWER_UNIT + 3);
      expect(() => device.read(1, MSR_RAPL_POWER_UNIT)).toThrow(
        /^cannot read MSR 0x606 on CPU 1: short read \(3 bytes\): .* 1545 bytes long, .* MSR 0x606 \(Intel RAPL power unit\); a fake MSR tree must hold/,
      );
    } finally {
      device.close();
      host.cleanup();
    }
  });

  test('a register without a name here is still named by number', () => {
    expect(describeMsr(0x123)).toBe('MSR 0x123');
    expect(describeMsr(MSR_AMD_RAPL_POWER_UNIT)).toBe('MSR 0xc0010299 (AMD RAPL power unit)');
  });

  test('the daemon on an Intel-only fake tree with --vendor amd exits naming the missing AMD register', async () => {
    const host = new FakeHost();
    const dir = tempDir();
    try {
      host.writeRapl({ vendor: 'intel', powerUnit: 0xa0e03n });
      const child = spawnHelper([...host.cliArgs('amd'), '--energy-source', 'msr', '-k', `${dir}/s.sock`, '-f', `${dir}/pid`]);
      const code = await child.exited;
      expect(code).not.toBe(0);
      expect(child.stderr()).toContain('MSR 0xc0010299 (AMD RAPL power unit)');
      expect(child.stderr()).toContain(host.msrPath(0));
      expect(child.stderr()).toContain(FAKE_MSR_TREE_DOC.replace(/"/g, '\\"'));
    } finally {
      host.cleanup();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
