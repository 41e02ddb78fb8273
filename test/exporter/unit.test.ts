/** contrib/systemd/vmsr-helper-exporter.service: systemd accepts it, and it is unprivileged and hardened. */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { BIN, ROOT, ensureBuilt, spawnHelper, tempDir, waitFor } from '../daemon/support/daemon-process.js';
import { DEFAULT_LISTEN } from '../../src/exporter/listen-address.js';
import { missing } from '../support/env.js';
import { exporterUrlIn } from './support/stack.js';

const cleanups: (() => unknown)[] = [];

const UNIT = 'vmsr-helper-exporter.service';
let dir: string | null = null;
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
  dir = null;
});

describe('contrib/systemd exporter unit', () => {
  const text = fs.readFileSync(path.join(ROOT, 'contrib/systemd', UNIT), 'utf8');

  test('runs unprivileged in the observer group, loopback only, with the default listen address', () => {
    for (const k of [
      'DynamicUser=yes',
      'SupplementaryGroups=kvm vmsr-observers',
      'CapabilityBoundingSet=\n',
      'NoNewPrivileges=yes',
      'ProtectSystem=strict',
      'PrivateDevices=yes',
      'IPAddressDeny=any',
      'IPAddressAllow=localhost',
    ]) {
      expect(text).toContain(k);
    }
    expect(text).toMatch(/^RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6$/m);
    expect(text).toMatch(new RegExp(`^ExecStart=vmsr-helper exporter .*--listen ${DEFAULT_LISTEN.replace(/\./g, '\\.')}$`, 'm'));
    // The socket it connects to is the helper unit's, whose group it joins.
    const socket = fs.readFileSync(path.join(ROOT, 'contrib/systemd/qemu-vmsr-helper.socket'), 'utf8');
    expect(text).toContain(`--socket ${/^ListenStream=(.*)$/m.exec(socket)![1]} `);
    expect(text).toContain(`SupplementaryGroups=${/^SocketGroup=(.*)$/m.exec(socket)![1]} `);
    expect(text).not.toMatch(/^User=root/m);
  });

  test('systemd-analyze verify accepts it (ExecStart pointed at the built binary)', (ctx) => {
    const why = missing({ command: 'systemd-analyze' });
    if (why) return ctx.skip(why);
    ensureBuilt();
    dir = tempDir('vmsr-exporter-unit-');
    fs.writeFileSync(path.join(dir, UNIT), text.replace(/^ExecStart=vmsr-helper /m, `ExecStart=${process.execPath} ${BIN} `));
    // The socket unit it refers to, so verify checks the dependency too.
    fs.copyFileSync(path.join(ROOT, 'contrib/systemd/qemu-vmsr-helper.socket'), path.join(dir, 'qemu-vmsr-helper.socket'));
    const out = execFileSync('sh', ['-c', `systemd-analyze verify ${dir}/${UNIT} 2>&1; echo "rc=$?"`], { encoding: 'utf8' });
    expect(out.trim()).toBe('rc=0');
  });

  test("the exporter serves under the unit's sandbox: another uid, no new privileges, /proc with only its own pid", async (ctx) => {
    const why = missing({ root: true }) ?? missing({ command: 'unshare' }) ?? missing({ command: 'setpriv' });
    if (why) return ctx.skip(why);
    ensureBuilt();
    // ProcSubset=pid + ProtectProc=invisible is this /proc mount; DynamicUser + NoNewPrivileges is setpriv.
    const script = [
      'mount -t proc -o subset=pid,hidepid=invisible proc /proc',
      `exec setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs ${process.execPath} ${BIN} exporter -k /nonexistent/helper.sock --listen 127.0.0.1:0`,
    ].join(' && ');
    const child = spawnHelper([], { command: ['unshare', '--mount', '--pid', '--fork', '--kill-child', 'sh', '-c', script] });
    // The exporter is the new pid namespace's init; setpriv's uid change clears the parent-death
    // signal --kill-child set, so killing unshare alone would leave it running: kill it first.
    cleanups.push(() => {
      const pid = child.proc.pid;
      try {
        for (const init of fs.readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/))
          process.kill(Number(init), 'SIGKILL');
      } catch {
        /* unshare or its child already gone */
      }
      return child.stop('SIGKILL');
    });
    await waitFor(() => exporterUrlIn(child.stderr()) !== null, 'the sandboxed exporter to serve', child);
    const url = exporterUrlIn(child.stderr())!;
    const body = await (await fetch(url)).text();
    expect(body).toContain('\nvmsr_exporter_helper_connected 0\n');
    expect(child.stderr()).toContain('no helper is listening at /nonexistent/helper.sock');
    expect(child.stderr()).not.toContain('runs as root');
  });
});
