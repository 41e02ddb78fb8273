/**
 * What a v2 client says when the socket it was given is not a usable vmsr-helper: a QEMU monitor
 * (real QEMU), a legacy-only helper that hangs up, a socket it may not open (real permissions, the
 * CLI run as another user).
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { V2Client, socketAccessHint } from '../../src/client/v2-client.js';
import { BIN, ensureBuilt } from '../daemon/support/daemon-process.js';
import { isRoot } from '../support/env.js';
import { qemuMissing, startQemu } from '../support/qemu.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function tmp(): string {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-sockerr-'));
  cleanups.push(() => fs.rmSync(d, { recursive: true, force: true }));
  return d;
}

async function listen(p: string, onConn: (s: net.Socket) => void): Promise<net.Server> {
  const srv = net.createServer(onConn);
  await new Promise<void>((r) => srv.listen(p, r));
  cleanups.push(() => new Promise((r) => srv.close(r)));
  return srv;
}

describe('v2 client on the wrong socket', () => {
  test('a QEMU QMP socket given as the helper socket is named as such, not as a bad frame type', async (ctx) => {
    const why = qemuMissing();
    if (why) return ctx.skip(why);
    const g = await startQemu({ mode: 'i', smp: 1 });
    cleanups.push(() => g.stop());
    const c = await V2Client.connect(g.qmpPath);
    const err = await c.register({ pid: g.pid, vcpus: [{ tid: g.pid, vpkg: 0 }] }).catch((e: Error) => e);
    expect(String(err)).toMatch(/is a QEMU monitor \(QMP\) socket, not a vmsr-helper socket; give the helper's socket with -k/);
    expect(String(err)).not.toMatch(/unknown frame type/);
    await c.close();
  });

  test("a helper that hangs up without a byte (QEMU's legacy-only qemu-vmsr-helper does) is named", async () => {
    const sock = path.join(tmp(), 'legacy.sock');
    // What QEMU's helper does with "VMS2" + REGISTER: reads an MSR number it refuses, closes.
    await listen(sock, (s) => s.once('data', () => s.destroy()));
    const c = await V2Client.connect(sock);
    const err = await c.register({ vcpus: [{ tid: process.pid, vpkg: 0 }] }).catch((e: Error) => e);
    expect(String(err)).toMatch(/closed the connection without answering: it does not speak the v2 protocol \(QEMU's own qemu-vmsr-helper/);
    await c.close();
  });

  test("EACCES names the socket's group and the fix (CLI run as nobody against a root:kvm 0660 socket)", async (ctx) => {
    if (!isRoot()) return ctx.skip('needs root to create a socket owned by another user');
    const kvm = /^kvm:[^:]*:(\d+):/m.exec(fs.readFileSync('/etc/group', 'utf8'));
    if (!kvm) return ctx.skip('no kvm group on this host');
    ensureBuilt();
    const dir = tmp();
    fs.chmodSync(dir, 0o755); // the directory is searchable: the socket's own mode decides
    const sock = path.join(dir, 'helper.sock');
    await listen(sock, () => {});
    fs.chownSync(sock, 0, Number(kvm[1]));
    fs.chmodSync(sock, 0o660);
    const r = await new Promise<{ code: number; stderr: string }>((resolve) =>
      execFile(process.execPath, [BIN, 'watch', '-k', sock, '--pid', '1', '--vcpus', '1:0'], { uid: 65534, gid: 65534 }, (e, _o, stderr) =>
        resolve({ code: e ? Number((e as { code?: number }).code ?? 1) : 0, stderr }),
      ),
    );
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(
      `cannot connect to ${sock}: permission denied (EACCES); the socket is mode 0660, group kvm: add this user to group kvm (usermod -aG kvm USER`,
    );
  });

  test('an owner-only socket says to give the group access, as the shipped .socket unit does', () => {
    const dir = tmp();
    const f = path.join(dir, 'owner-only');
    fs.writeFileSync(f, '');
    fs.chmodSync(f, 0o600);
    fs.writeFileSync(path.join(dir, 'group'), `staff:x:${fs.statSync(f).gid}:\n`);
    expect(socketAccessHint(f, path.join(dir, 'group'))).toMatch(
      /mode 0600, group staff, so only its owner connects: .*SocketGroup=kvm, SocketMode=0660/,
    );
    expect(socketAccessHint(path.join(dir, 'missing'))).toMatch(/run as root, or as a member of the socket's group/);
  });
});
