/** The one MSR errno -> fix map (src/msr/errno-hints.ts), as the daemon's startup check and record use it. */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect, test } from 'vitest';
import { TRY_WITHOUT_RAPL, msrErrnoHint } from '../../src/msr/errno-hints.js';
import { MsrDevice } from '../../src/msr/device.js';
import { openMsrDevices } from '../../src/helper/lifecycle/startup-checks.js';

test('a missing device, an absent CPU (ENXIO) and an unbound driver (ENODEV) all get the modprobe fix', () => {
  for (const code of ['ENOENT', 'ENXIO', 'ENODEV']) {
    expect(msrErrnoHint(code)).toEqual({
      why: 'the MSR device does not exist',
      fix: "load the msr driver with 'modprobe msr' (or point --msr-path at the devices)",
    });
  }
  expect(msrErrnoHint('EPERM')?.fix).toBe('run as root or with CAP_SYS_RAWIO');
  expect(msrErrnoHint('EACCES')?.fix).toBe('run as root or with CAP_SYS_RAWIO');
  expect(msrErrnoHint('EIO')?.why).toMatch(/does not implement this register/);
  // A CPU without RAPL (most virtual machines): the way to try it anyway is offered.
  expect(msrErrnoHint('EIO')?.fix).toBe(`run on a host whose CPU has RAPL; or, ${TRY_WITHOUT_RAPL}`);
  expect(msrErrnoHint('EBADF')).toBeUndefined();
  expect(msrErrnoHint(undefined)).toBeUndefined();
});

test('the daemon start-up check words a missing device as "cannot open P: why; fix"', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-errno-'));
  try {
    const device = new MsrDevice(path.join(dir, '%u/msr'));
    expect(() => openMsrDevices(device, [{ cpu: 3, pkg: 0 }])).toThrow(
      `cannot open ${path.join(dir, '3/msr')}: the MSR device does not exist; load the msr driver with 'modprobe msr' (or point --msr-path at the devices)`,
    );
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
