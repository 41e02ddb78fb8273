/**
 * The README's install, done for real into a temporary root: `npm pack`, `npm install -g` of the
 * tarball (a copy, not a link to this clone as `npm install -g .` makes, which ProtectHome= and
 * PrivateTmp= then hide from the service), the units copied to <root>/etc/systemd/system, checked
 * by `systemd-analyze verify --root` (which resolves ExecStart= through ExecSearchPath= inside the
 * root), enabled with `systemctl --root`, and the installed binary run the way the units run it:
 * found through ExecSearchPath=, with that PATH, socket-activated, reporting READY=1.
 * What cannot run here: systemd as PID 1 starting it, and /dev/cpu/N/msr (a FakeHost stands in).
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { FakeHost } from '../support/fake-host.js';
import { missing, which } from '../support/env.js';
import { ensureBuilt, hostArgs, LegacyClient, ROOT, spawnHelper, tempDir, waitFor, type DaemonChild } from './support/daemon-process.js';
import { NotifyReceiver } from './support/notify-socket.js';

const UNITS = ['qemu-vmsr-helper.socket', 'qemu-vmsr-helper.service'];

function unitValue(text: string, key: string): string {
  const v = text
    .split('\n')
    .filter((l) => l.startsWith(`${key}=`))
    .map((l) => l.slice(key.length + 1).trim());
  if (v.length !== 1) throw new Error(`expected one ${key}= in the unit, got ${v.length}`);
  return v[0]!;
}

function npm(args: string[], cwd: string): string {
  return execFileSync('npm', [...args, '--no-audit', '--no-fund', '--prefer-offline', '--loglevel=error'], {
    cwd,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

describe('install from a packed tarball into a fresh root', () => {
  let root = '';
  let tarball = '';
  const why =
    missing({ command: 'npm' }) ??
    missing({ command: 'systemd-analyze' }) ??
    (fs.existsSync('/usr/lib/systemd/system/sysinit.target')
      ? null
      : 'no /usr/lib/systemd/system/sysinit.target (systemd units not installed) to verify against');

  beforeAll(() => {
    if (why) return;
    root = tempDir('vmsr-install-root-');
    // `npm pack` would run `prepare` (tsc into dist/) while other test files run dist/: build once
    // here the way they do, then pack without scripts. The README's `npm pack` builds by itself.
    ensureBuilt();
    const out = npm(['pack', '--ignore-scripts', '--pack-destination', root], ROOT).trim().split('\n').at(-1)!;
    tarball = path.join(root, out);
    npm(['install', '-g', '--prefix', path.join(root, 'usr/local'), tarball], root);
    const etc = path.join(root, 'etc/systemd/system');
    fs.mkdirSync(etc, { recursive: true });
    for (const u of UNITS) fs.copyFileSync(path.join(ROOT, 'contrib/systemd', u), path.join(etc, u));
    // systemd-analyze --root needs the distribution's units (sysinit.target, modprobe@.service) and,
    // like a real Debian host with qemu-system-common, finds its qemu-vmsr-helper units there too.
    fs.mkdirSync(path.join(root, 'usr/lib/systemd'), { recursive: true });
    fs.cpSync('/usr/lib/systemd/system', path.join(root, 'usr/lib/systemd/system'), { recursive: true, verbatimSymlinks: true });
    // ExecReload=/bin/kill -HUP $MAINPID, as on every Debian host (procps): the root gets the host's kill.
    fs.mkdirSync(path.join(root, 'bin'), { recursive: true });
    fs.copyFileSync(fs.realpathSync('/bin/kill'), path.join(root, 'bin/kill'));
    fs.chmodSync(path.join(root, 'bin/kill'), 0o755);
  }, 120_000);
  afterAll(() => {
    if (root) fs.rmSync(root, { recursive: true, force: true });
  });

  test("docs/install.md's install block is the one this file carries out", () => {
    const doc = fs.readFileSync(path.join(ROOT, 'docs/install.md'), 'utf8');
    const section = doc.slice(doc.indexOf('## Installing it in place of qemu-vmsr-helper'));
    const block = /```sh\n([\s\S]*?)```/.exec(section)![1]!;
    const commands = block
      .split('\n')
      .map((l) => l.replace(/\s+#.*$/, '').trim())
      .filter(Boolean);
    expect(commands).toEqual([
      'npm ci',
      'npm pack',
      'npm install -g ./vmsr-helper-*.tgz',
      `cp ${UNITS.map((u) => `contrib/systemd/${u}`).join(' ')} /etc/systemd/system/`,
      'systemctl daemon-reload',
      'systemctl stop qemu-vmsr-helper.service qemu-vmsr-helper.socket',
      'modprobe msr',
      'systemctl enable --now qemu-vmsr-helper.socket',
      'systemctl start qemu-vmsr-helper.service',
      'systemctl status qemu-vmsr-helper.service',
    ]);
  });

  test('the installed binary is a copy inside the prefix, not a link into this clone', (ctx) => {
    if (why) return ctx.skip(why);
    const bin = path.join(root, 'usr/local/bin/vmsr-helper');
    const real = fs.realpathSync(bin);
    expect(real.startsWith(fs.realpathSync(root) + path.sep)).toBe(true);
    expect(real.startsWith(ROOT + path.sep)).toBe(false);
    expect(fs.lstatSync(path.join(root, 'usr/local/lib/node_modules/vmsr-helper')).isSymbolicLink()).toBe(false);
    // The units and the bundled trace ship in the package too.
    for (const f of [...UNITS.map((u) => `contrib/systemd/${u}`), 'traces/qemu-spin-vs-idle.jsonl.gz']) {
      expect(fs.existsSync(path.join(root, 'usr/local/lib/node_modules/vmsr-helper', f)), f).toBe(true);
    }
  });

  test('systemd-analyze verify --root accepts the copied units, and fails once the binary is gone', (ctx) => {
    if (why) return ctx.skip(why);
    const verify = () =>
      execFileSync('sh', ['-c', `systemd-analyze verify --root="$1" ${UNITS.join(' ')} 2>&1; echo "rc=$?"`, 'sh', root], {
        encoding: 'utf8',
      }).trim();
    expect(verify()).toBe('rc=0');
    // The check is real: it resolved ExecStart=vmsr-helper through ExecSearchPath= inside the root.
    const bin = path.join(root, 'usr/local/bin/vmsr-helper');
    fs.renameSync(bin, `${bin}.away`);
    try {
      expect(verify()).toMatch(/Command vmsr-helper is not executable[\s\S]*rc=1$/);
    } finally {
      fs.renameSync(`${bin}.away`, bin);
    }
  });

  test("systemctl --root enable links our socket unit from /etc, which overrides the distribution's", (ctx) => {
    if (why) return ctx.skip(why);
    if (!which('systemctl')) return ctx.skip('systemctl not installed');
    execFileSync('systemctl', ['--root', root, 'enable', 'qemu-vmsr-helper.socket'], { stdio: 'ignore' });
    const link = path.join(root, 'etc/systemd/system/sockets.target.wants/qemu-vmsr-helper.socket');
    expect(fs.readlinkSync(link)).toBe('/etc/systemd/system/qemu-vmsr-helper.socket');
  });

  test("the binary the unit finds runs socket-activated with the unit's PATH and reports READY=1", async (ctx) => {
    if (why) return ctx.skip(why);
    const noActivate = missing({ command: 'systemd-socket-activate' });
    if (noActivate) return ctx.skip(noActivate);
    const service = fs.readFileSync(path.join(root, 'etc/systemd/system/qemu-vmsr-helper.service'), 'utf8');
    const name = unitValue(service, 'ExecStart');
    const search = unitValue(service, 'ExecSearchPath').split(':');
    // What systemd does: the first directory of ExecSearchPath= holding the name (here inside the root).
    const found = search.map((d) => path.join(root, d, name)).find((p) => fs.existsSync(p));
    expect(found).toBe(path.join(root, 'usr/local/bin/vmsr-helper'));
    const host = new FakeHost();
    host.writePackageMsr(0, 0x606, 0xa1003n);
    const dir = tempDir();
    const sock = path.join(dir, 'qemu-vmsr-helper.sock');
    const notify = new NotifyReceiver(path.join(dir, 'notify'));
    let child: DaemonChild | undefined;
    try {
      // ExecSearchPath= is also the service's PATH: `#!/usr/bin/env node` must find node in it.
      const env = { PATH: search.join(':'), NOTIFY_SOCKET: notify.name };
      child = spawnHelper(hostArgs(host), {
        command: ['systemd-socket-activate', '-l', sock, ...Object.entries(env).flatMap(([k, v]) => ['-E', `${k}=${v}`]), found!],
        env: { ...process.env, ...env },
      });
      await waitFor(() => fs.existsSync(sock), 'the socket', child);
      const c = await LegacyClient.connect(sock);
      expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
      c.close();
      await waitFor(() => notify.messages.some((m) => m.includes('READY=1')), 'READY=1', child);
      expect(await child.stop('SIGTERM')).toBe(0);
    } finally {
      await child?.stop('SIGKILL');
      notify.close();
      host.cleanup();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
