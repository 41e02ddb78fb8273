/**
 * A real Linux guest reads its VM's energy through QEMU's 9p: Debian's kernel and a busybox
 * initramfs built here from the installed packages (test/support/linux-guest/make-initramfs.sh: the
 * virtio and 9p modules, an /init that mounts the tag "vmsr", spins, and prints every zone's
 * energy_uj each second on the serial console), booted with TCG (nested KVM stalls that kernel's early
 * boot). The daemon (discovery on, fake MSRs counting package, core, DRAM and PSYS) finds the QEMU by
 * its `CPU 0/TCG` thread and publishes into DIR/<its -uuid>/, which QEMU shares read-only.
 */
import { execFileSync, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type VmUpdate } from '../../src/client/v2-replies.js';
import { countingHost } from './support.js';
import { missing } from '../support/env.js';
import { hostArgs, spawnHelper, tempDir, waitFor } from '../daemon/support/daemon-process.js';

const MAKE_INITRAMFS = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../support/linux-guest/make-initramfs.sh');
/** Seconds the guest reads and prints, once booted. */
const GUEST_SECONDS = 25;

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** One printed line: "GUEST t=N package-0=U core=U dram=U psys=U" -> name -> µJ. */
function parseLine(l: string): Map<string, bigint> {
  return new Map([...l.matchAll(/(\S+)=(\d+)/g)].filter((m) => m[1] !== 't').map((m) => [m[1]!, BigInt(m[2]!)]));
}

describe('a real Linux guest', { timeout: 300_000 }, () => {
  it("reads its package, core, DRAM and PSYS energy over 9p, growing, and its package energy over its window is the helper's for that VM", async (ctx) => {
    const why = missing({ root: true, qemu: true, command: 'cpio' });
    if (why) return ctx.skip(why);
    const tmp = tempDir('vmsr-linux-guest-');
    cleanups.push(() => fs.rmSync(tmp, { recursive: true, force: true }));
    let kernel: string;
    try {
      kernel = execFileSync(MAKE_INITRAMFS, [tmp, String(GUEST_SECONDS)], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim();
    } catch (e) {
      const err = (e as { stderr?: string }).stderr?.trim() ?? String(e);
      return ctx.skip(`no Linux guest here: ${err}`);
    }

    const fake = countingHost(cleanups, 1500, 500);

    const guests = path.join(tmp, 'guests');
    const uuid = crypto.randomUUID();
    fs.mkdirSync(path.join(guests, uuid), { recursive: true });
    const sock = path.join(tmp, 'h.sock');
    const helper = spawnHelper(['-k', sock, ...hostArgs(fake), '--interval', '0.1', '--guest-dir', guests]);
    cleanups.push(() => helper.stop('SIGKILL'));
    await waitFor(() => helper.stderr().includes('"msg":"Listening on'), 'the helper to listen', helper);

    const qemu = spawn(
      'qemu-system-x86_64',
      [
        ...['-accel', 'tcg', '-m', '256', '-smp', '1', '-nographic', '-no-reboot', '-nodefaults', '-serial', 'stdio'],
        ...['-name', 'guest=vmsr-linux-guest,debug-threads=on', '-uuid', uuid],
        ...['-kernel', kernel, '-initrd', path.join(tmp, 'initramfs.gz'), '-append', 'console=ttyS0 quiet panic=-1 no_timer_check'],
        ...['-virtfs', `local,path=${path.join(guests, uuid)},mount_tag=vmsr,security_model=none,readonly=on`],
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let serial = '';
    qemu.stdout.on('data', (d: Buffer) => (serial += d.toString('latin1')));
    qemu.stderr.on('data', (d: Buffer) => (serial += d.toString('latin1')));
    const exited = new Promise((r) => qemu.once('exit', r));
    cleanups.push(async () => {
      if (qemu.exitCode === null && qemu.signalCode === null) qemu.kill('SIGKILL');
      await exited;
    });

    // The helper's own values for the VM, as each guest line arrives: the latest UPDATE at that moment.
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    let vmId = -1;
    const deadline = Date.now() + 30_000;
    while (vmId < 0) {
      if (Date.now() > deadline)
        throw new Error(`timed out waiting for the helper to discover the TCG QEMU:\n${helper.stderr().slice(-2000)}`);
      vmId = (await c.list()).find((v) => v.pid === qemu.pid)?.hostVmId ?? -1;
      if (vmId < 0) await new Promise((r) => setTimeout(r, 200));
    }
    let latest: VmUpdate | null = null;
    latest = await c.observe(vmId, (u) => (latest = u));
    const seen: { guest: Map<string, bigint>; helper: bigint; line: string }[] = [];
    let taken = 0;
    await waitFor(
      () => {
        // Whole lines only: the console's last line may still be arriving (a part of it has fewer zones).
        const lines = serial
          .slice(0, serial.lastIndexOf('\n') + 1)
          .split('\n')
          .filter((l) => l.includes('GUEST t='));
        for (; taken < lines.length; taken++)
          seen.push({ guest: parseLine(lines[taken]!), helper: latest!.vpkgs[0]!.energyUj, line: lines[taken]! });
        return serial.includes('GUEST done') || qemu.exitCode !== null;
      },
      'the guest to read its zones for its window',
      helper,
      180_000,
    );
    expect(serial, serial.slice(-2000)).not.toMatch(/GUEST (insmod .* failed|mount failed)/);
    expect(serial).toMatch(/GUEST zones intel-rapl:0 intel-rapl:0:0 intel-rapl:0:1 intel-rapl:1/);
    expect(seen.length).toBeGreaterThanOrEqual(GUEST_SECONDS - 2);

    // The first lines come while the kernel still settles: the window is the rest.
    const first = seen[2]!;
    const last = seen.at(-1)!;
    for (const zone of ['package-0', 'core', 'dram', 'psys']) {
      const said = `${zone}, from "${first.line}" to "${last.line}"; the guest's other lines: ${serial
        .split('\n')
        .filter((l) => !l.includes('GUEST t='))
        .slice(-30)
        .join(' | ')}`;
      expect(last.guest.get(zone)!, said).toBeGreaterThan(first.guest.get(zone)!);
    }
    const guestDelta = Number(last.guest.get('package-0')! - first.guest.get('package-0')!);
    const helperDelta = Number(last.helper - first.helper);
    if (process.env.VMSR_GUEST_REPORT) console.log(`guest ${guestDelta} µJ, helper ${helperDelta} µJ over ${seen.length - 3} s`);
    expect(Math.abs(guestDelta - helperDelta) / helperDelta, `guest ${guestDelta} µJ, helper ${helperDelta} µJ`).toBeLessThan(0.02);
  });
});
