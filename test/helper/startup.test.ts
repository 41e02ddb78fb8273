/**
 * The one start-up path (helper/lifecycle/startup.ts): each step once, in order, adopted when
 * inherited. Real sockets and files; the MSR devices are the fake host's sparse files.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { FakeHost } from '../support/fake-host.js';
import { missing } from '../support/env.js';
import { ensureBuilt, ROOT, tempDir } from '../daemon/support/daemon-process.js';
import { parseDaemonOptions } from '../../src/cli/commands/start-daemon.js';
import type { DaemonConfig } from '../../src/helper/lifecycle/config.js';
import { openStart, type Opened } from '../../src/helper/lifecycle/startup.js';
import { INHERIT_ENV, inheritEnv, inheritedFds, takeInherited, type Inherited } from '../../src/helper/handover/inherited.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function setup(): { host: FakeHost; dir: string; procRoot: string; config: (o?: { socket?: string; pidfile?: string }) => DaemonConfig } {
  const host = new FakeHost();
  const dir = tempDir('vmsr-startup-');
  cleanups.push(
    () => host.cleanup(),
    () => fs.rmSync(dir, { recursive: true, force: true }),
  );
  const procRoot = path.join(dir, 'proc');
  fs.mkdirSync(procRoot);
  fs.writeFileSync(path.join(procRoot, 'cpuinfo'), 'processor\t: 0\nvendor_id\t: GenuineIntel\n');
  const config = (o: { socket?: string; pidfile?: string } = {}) =>
    parseDaemonOptions({
      socket: o.socket ?? path.join(dir, 'h.sock'),
      ...(o.pidfile ? { pidfile: o.pidfile } : {}),
      msrPath: host.msrPathTemplate,
      sysRoot: host.sysRoot,
      procRoot,
      vendor: 'auto',
      quiet: true,
    });
  return { host, dir, procRoot, config };
}

const stepsOf = (o: Opened) => o.steps.map((s) => `${s.step}: ${s.done}`);

describe('openStart', () => {
  test('a fresh start runs each step once, in order, binds the socket 0600 and undoes it all at close', async () => {
    const { dir, config } = setup();
    const sock = path.join(dir, 'h.sock');
    const pid = path.join(dir, 'h.pid');
    const opened = await openStart(config({ pidfile: pid }), { how: 'fresh' });
    expect(stepsOf(opened)).toEqual(['checks: ran', 'msr: ran', 'listen: ran', 'pidfile: ran', 'files: not asked']);
    expect(opened.steps.map((s) => s.step)).toEqual(['checks', 'msr', 'listen', 'pidfile', 'files']);
    expect([opened.vendor, opened.cpus]).toEqual([
      'intel',
      [
        { cpu: 0, pkg: 0 },
        { cpu: 1, pkg: 0 },
      ],
    ]);
    expect(opened.device.openFds().map(([cpu]) => cpu)).toEqual([0, 1]);
    expect(fs.statSync(sock).mode & 0o777).toBe(0o600);
    expect(opened.listener.where).toBe(sock);
    expect(fs.readFileSync(pid, 'utf8').trim()).toBe(String(process.pid));
    await opened.close();
    expect(fs.existsSync(sock)).toBe(false);
    expect(fs.existsSync(pid)).toBe(false);
  });

  test("a start given the checks' results and MSR fds does not run the checks again: it starts on a host whose checks now fail", async () => {
    const { host, dir, procRoot, config } = setup();
    const first = await openStart(config(), { how: 'fresh' });
    cleanups.push(() => first.listener.close());
    const handed = first.handover('reexec');
    // The host's checks fail from now on: no cpuinfo, no sysfs topology.
    fs.rmSync(path.join(procRoot, 'cpuinfo'));
    fs.rmSync(path.join(host.sysRoot, 'devices/system/cpu/online'));
    const other = path.join(dir, 'other.sock');
    await expect(openStart(config({ socket: other }), { how: 'fresh' })).rejects.toThrow(/^cannot read .*cpuinfo to tell the CPU vendor/);
    // The listener is left out: two servers on one fd in one process would both close it.
    const { listener: _, ...withoutListener } = handed;
    const second = await openStart(config({ socket: other }), withoutListener);
    expect(stepsOf(second)).toEqual(['checks: adopted', 'msr: adopted', 'listen: ran', 'pidfile: not asked', 'files: not asked']);
    expect([second.vendor, second.cpus]).toEqual([first.vendor, first.cpus]);
    expect(second.device.openFds()).toEqual(first.device.openFds());
    await second.close();
  });

  test('on a host without MSR devices auto opens every powercap zone energy_uj as the energy step, and a start handed them adopts them', async () => {
    const { host, dir, config } = setup();
    host.writePowercap([
      { id: '0', name: 'package-0', max: 1000n, uj: 5n },
      { id: '0:0', name: 'dram', max: 1000n, uj: 6n },
    ]);
    fs.rmSync(path.join(host.dir, 'dev'), { recursive: true }); // no MSR device
    const first = await openStart(config(), { how: 'fresh' });
    cleanups.push(() => first.close());
    expect(stepsOf(first).slice(0, 2)).toEqual(['checks: ran', 'msr: ran']);
    expect([first.energy, first.energyWhy]).toEqual([
      'powercap',
      expect.stringMatching(/^auto: no MSR device \(.*ENOENT\), the powercap zones open$/),
    ]);
    expect(first.device.openFds()).toEqual([]);
    const zones = [...first.powercap.keys()].map((f) => path.relative(host.sysRoot, f));
    expect(zones).toEqual(['class/powercap/intel-rapl:0/energy_uj', 'class/powercap/intel-rapl:0:0/energy_uj']);
    const handed = first.handover('reexec');
    expect(handed.checks?.energy).toBe('powercap');
    expect(handed.powercap).toEqual([...first.powercap]);
    const { listener: _, ...withoutListener } = handed;
    const second = await openStart(config({ socket: path.join(dir, 'other.sock') }), withoutListener);
    cleanups.push(() => second.listener.close());
    expect(stepsOf(second).slice(0, 2)).toEqual(['checks: adopted', 'msr: adopted']);
    expect([...second.powercap]).toEqual([...first.powercap]);
    expect(second.energy).toBe('powercap');
  });

  test('files plug-ins write are created once, before the drop, and adopted when inherited', async () => {
    const { dir, config } = setup();
    const rec = path.join(dir, 'rec.jsonl');
    const first = await openStart(config(), { how: 'fresh' }, { files: [rec] });
    cleanups.push(() => first.close());
    expect(stepsOf(first).at(-1)).toBe('files: ran');
    const fd = first.files.get(rec)!;
    expect(fs.fstatSync(fd).ino).toBe(fs.statSync(rec).ino);
    fs.writeSync(fd, 'kept\n');
    const { listener: _, ...handed } = first.handover('reexec');
    const second = await openStart(config({ socket: path.join(dir, 'other.sock') }), handed, { files: [rec] });
    cleanups.push(() => second.listener.close());
    expect(stepsOf(second).at(-1)).toBe('files: adopted');
    expect(second.files.get(rec)).toBe(fd);
    expect(fs.readFileSync(rec, 'utf8')).toBe('kept\n'); // not created (truncated) again
  });

  test('a start with an inherited listening socket (socket activation) adopts it and binds nothing', async (ctx) => {
    const why = missing({ command: 'python3' });
    if (why) return ctx.skip(why);
    const { dir, config } = setup();
    ensureBuilt();
    const act = path.join(dir, 'act.sock');
    const notBound = path.join(dir, 'h.sock');
    const dist = (f: string) => JSON.stringify(path.join(ROOT, 'dist/src', f));
    // In the child: the listening fd at 3 with LISTEN_PID/LISTEN_FDS, as systemd passes it.
    const script = `
      const { openStart } = await import(${dist('helper/lifecycle/startup.js')});
      const { inheritFromEnvironment } = await import(${dist('helper/lifecycle/systemd.js')});
      const config = { ...${JSON.stringify(config({ socket: notBound }))}, socketPathGiven: false };
      const opened = await openStart(config, inheritFromEnvironment(false));
      opened.listener.serve((s) => s.end('served by fd ' + opened.listener.fd), (e) => { throw e; });
      const steps = opened.steps.map((s) => s.step + ': ' + s.done);
      console.log(JSON.stringify({ steps, where: opened.listener.where, bound: (await import('node:fs')).existsSync(${JSON.stringify(notBound)}) }));
      setTimeout(() => opened.close().then(() => process.exit(0)), 500);`;
    const python = `
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1]); s.listen(8)
os.dup2(s.fileno(), 3); os.set_inheritable(3, True)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1')
os.execv(sys.argv[2], [sys.argv[2], '--input-type=module', '-e', sys.argv[3]])`;
    const child = execFileSync('python3', ['-c', python, act, process.execPath, script], { encoding: 'utf8', timeout: 20_000, input: '' });
    expect(JSON.parse(child.trim().split('\n')[0]!)).toEqual({
      steps: ['checks: ran', 'msr: ran', 'listen: adopted', 'pidfile: not asked', 'files: not asked'],
      where: 'systemd socket (fd 3)',
      bound: false,
    });
    expect(fs.existsSync(notBound)).toBe(false);
    expect(fs.statSync(act).isSocket()).toBe(true); // systemd's socket: not ours to remove
  });

  test("inheritFromEnvironment takes systemd's listening socket and carries the fds the helper stored as named fds, and refuses a non-socket", (ctx) => {
    const why = missing({ command: 'python3' });
    if (why) return ctx.skip(why);
    const { dir } = setup();
    ensureBuilt();
    const inherited = JSON.stringify(path.join(ROOT, 'dist/src/helper/lifecycle/systemd.js'));
    const script = `
      const { inheritFromEnvironment } = await import(${inherited});
      try {
        const i = inheritFromEnvironment(false);
        console.log(JSON.stringify({ how: i.how, listener: i.listener, named: [...(i.named ?? [])] }));
      } catch (e) { console.log(JSON.stringify({ error: e.message })); }`;
    // fd 3: a pipe stored by the helper as vmsr-state; fd 4: the .socket unit's listening socket (or, second run, a pipe).
    const python = `
import os, socket, sys
r, w = os.pipe()
os.dup2(r, 3); os.set_inheritable(3, True)
if sys.argv[4] == 'socket':
    s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8); os.dup2(s.fileno(), 4)
else:
    os.dup2(w, 4)
os.set_inheritable(4, True)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='2', LISTEN_FDNAMES='vmsr-state:qemu-vmsr-helper.socket')
os.execv(sys.argv[2], [sys.argv[2], '--input-type=module', '-e', sys.argv[3]])`;
    const run = (fd4: string) =>
      JSON.parse(
        execFileSync('python3', ['-c', python, path.join(dir, `${fd4}.sock`), process.execPath, script, fd4], {
          encoding: 'utf8',
          timeout: 20_000,
          input: '',
        }).trim(),
      );
    expect(run('socket')).toEqual({ how: 'systemd', listener: { fd: 4 }, named: [['vmsr-state', [3]]] });
    expect(run('pipe')).toEqual({ error: expect.stringMatching(/^cannot use the socket systemd passed as fd 4: .*; /) });
  });

  test('a connection made before serve() waits and is served once the server serves', async () => {
    const { dir, config } = setup();
    const opened = await openStart(config(), { how: 'fresh' });
    cleanups.push(() => opened.close());
    const c = net.connect(path.join(dir, 'h.sock'));
    cleanups.push(() => c.destroy());
    await new Promise((r) => c.once('connect', r));
    await new Promise((r) => setTimeout(r, 50)); // accepted by the listener meanwhile, and held
    const got = new Promise<string>((r) => c.once('data', (d) => r(d.toString())));
    opened.listener.serve(
      (s) => s.resume().end('late'),
      (e) => {
        throw e;
      },
    );
    expect(await got).toBe('late');
  });
});

describe('Inherited across an exec', () => {
  test('an Inherited crosses the exec environment whole, named fds included, and is taken once', () => {
    const inh: Inherited = {
      how: 'reexec',
      checks: {
        vendor: 'amd',
        cpus: [
          { cpu: 0, pkg: 0 },
          { cpu: 1, pkg: 1 },
        ],
        energy: 'powercap',
        energyWhy: 'asked for',
      },
      msr: [
        [0, 7],
        [1, 8],
      ],
      powercap: [['/sys/class/powercap/intel-rapl:0/energy_uj', 13]],
      listener: { fd: 9, file: { path: '/run/x.sock', ino: 1234 } },
      pidfile: '/run/x.pid',
      files: [['/var/log/rec.jsonl', 10]],
      dropped: true,
      named: new Map([['stats', [11, 12]]]),
    };
    const env: NodeJS.ProcessEnv = { ...inheritEnv(inh) };
    expect(takeInherited(env)).toEqual(inh);
    expect(env[INHERIT_ENV]).toBeUndefined();
    expect(takeInherited(env)).toBeNull();
    expect(inheritedFds(inh).sort((a, b) => a - b)).toEqual([7, 8, 9, 10, 11, 12, 13]);
  });

  test('a malformed Inherited is refused naming the fix: MSR fds without the checks, a bad fd, not JSON', () => {
    const bad = [
      JSON.stringify({ how: 'reexec', msr: [[0, 7]] }),
      JSON.stringify({ how: 'reexec', listener: { fd: -1 } }),
      JSON.stringify({ how: 'reexec', powercap: [['/sys/x', 7]] }),
      JSON.stringify({ how: 'reexec', checks: { vendor: 'intel', cpus: [], energy: 'perf' } }),
      JSON.stringify({ how: 'elsewhere' }),
      '{',
    ];
    for (const text of bad) {
      expect(() => takeInherited({ [INHERIT_ENV]: text })).toThrow(
        new RegExp(`^cannot read ${INHERIT_ENV}: .*; it is set by the helper for itself, do not set it$`),
      );
    }
  });
});
