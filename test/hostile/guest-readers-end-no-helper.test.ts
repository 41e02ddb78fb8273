/**
 * Readers of a guest directory (the guest through QEMU's 9p, or any user allowed to read it) opened every file
 * of a zone, as `grep -r` does, the spare the helper rewrites under a write lease included: an open while it was
 * held broke the lease, which was signalled with SIGIO, whose default ends the process, from the second lease of
 * a file on (letting a lease go resets F_SETSIG), and the helper died. The real daemon at its shortest interval
 * publishing its VMs' trees, and real processes opening every file of their zones as fast as they can.
 */
import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { waitFor } from '../daemon/support/daemon-process.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { guestRoot, notRoot, onCleanup, startGuestDirDaemon } from './support.js';

/**
 * argv: milliseconds, then the files. Opens, reads and closes each in turn until the time is up; prints the opens.
 * A spare the helper let go (a reader held it) is made anew: an open between the two finds no file.
 */
const READER = `
const fs = require('node:fs');
const [ms, ...files] = process.argv.slice(1);
const buf = Buffer.alloc(64);
const until = Date.now() + Number(ms);
let opens = 0;
while (Date.now() < until) {
  for (const f of files) {
    let fd;
    try {
      fd = fs.openSync(f, 'r');
    } catch (e) {
      if (e.code === 'ENOENT') continue;
      throw e;
    }
    fs.readSync(fd, buf, 0, 64, 0);
    fs.closeSync(fd);
    opens++;
  }
}
process.stdout.write(String(opens));
`;

/** Runs READER for `ms` over `files`; resolves with its opens, or throws with how it ended. */
function readAsFastAsPossible(ms: number, files: string[]): Promise<number> {
  const p = spawn(process.execPath, ['-e', READER, String(ms), ...files], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  p.stdout.on('data', (d: Buffer) => (out += d.toString()));
  p.stderr.on('data', (d: Buffer) => (err += d.toString()));
  return new Promise((resolve, reject) =>
    p.once('exit', (code) => (code === 0 ? resolve(Number(out)) : reject(new Error(`a reader ended with ${code}: ${err}`)))),
  );
}

const readUj = (f: string): bigint => BigInt(fs.readFileSync(f, 'utf8').trim());

describe.each([
  { vms: 1, readers: 2, ms: 4000 },
  { vms: 3, readers: 1, ms: 6000 },
])('readers opening guest files as fast as they can ($readers readers, $vms VMs, $ms ms)', ({ vms, readers, ms }) => {
  it('end no helper: it serves on and the zones keep moving', { timeout: 180_000 }, async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const dir = guestRoot();
    const daemon = await startGuestDirDaemon(dir, ['--interval', '0.01']);
    const zones = await Promise.all(
      Array.from({ length: vms }, async () => {
        const uuid = crypto.randomUUID();
        fs.mkdirSync(path.join(dir, uuid));
        const qemu = await new FakeQemu({ vcpus: 1, args: ['-uuid', uuid] }).ready();
        onCleanup(() => qemu.kill());
        await qemu.cmd('spin 0');
        return path.join(dir, uuid, 'intel-rapl:0/energy_uj');
      }),
    );
    // Every file of each zone: energy_uj, max_energy_range_uj and name, and the spare rewritten under a lease.
    const files = () => zones.flatMap((z) => fs.readdirSync(path.dirname(z)).map((n) => path.join(path.dirname(z), n)));
    await waitFor(() => zones.every((z) => fs.existsSync(z)) && files().length > 3 * vms, "every zone's files and spare", daemon, 60_000);

    const every = files();
    const opens = await Promise.all(Array.from({ length: readers }, () => readAsFastAsPossible(ms, every)));
    expect(daemon.proc.exitCode, `the helper ended: ${daemon.stderr().slice(-2000)}`).toBeNull();
    expect(daemon.proc.signalCode, 'the helper was ended by a signal').toBeNull();
    // Enough opens that some land inside a rewrite: thousands per second against 100 rewrites per second per zone.
    expect(
      opens.reduce((a, b) => a + b, 0),
      'opens the readers made',
    ).toBeGreaterThan(ms);
    for (const z of zones) {
      const before = readUj(z);
      await waitFor(() => readUj(z) > before, `${z} to move after the readers`, daemon, 30_000);
    }
  });
});
