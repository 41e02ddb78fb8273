/**
 * The daemon's life on real processes: signals clean up, pidfile refusal and stale replacement,
 * stale vs live socket, -d, privilege drop seen in /proc/<pid>/status, start-up errors, unit files.
 */
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { FakeHost } from '../support/fake-host.js';
import { missing } from '../support/env.js';
import { processEnded } from '../support/wait.js';
import { parseProcStatus } from '../../src/os/privileges/proc-status.js';
import { DAEMON_NODE_FLAGS } from '../../src/os/privileges/reexec.js';
import {
  BIN,
  ensureBuilt,
  hostArgs,
  LegacyClient,
  ROOT,
  spawnHelper,
  startHelper,
  tempDir,
  waitFor,
  type DaemonChild,
} from './support/daemon-process.js';

const cleanups: (() => void | Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function setup(): { host: FakeHost; dir: string; sock: string; pid: string } {
  const host = new FakeHost();
  host.writePackageMsr(0, 0x606, 0xa1003n);
  const dir = tempDir();
  fs.chmodSync(dir, 0o755);
  cleanups.push(() => {
    host.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return { host, dir, sock: path.join(dir, 'h.sock'), pid: path.join(dir, 'h.pid') };
}

function track(child: DaemonChild): DaemonChild {
  cleanups.push(() => child.stop('SIGKILL'));
  return child;
}

describe('signals', () => {
  for (const sig of ['SIGTERM', 'SIGINT'] as const) {
    test(`${sig}: clients closed, socket and pidfile removed, exit 0`, async () => {
      const { host, sock, pid } = setup();
      const child = track(await startHelper(['-k', sock, '-f', pid, ...hostArgs(host)]));
      expect(fs.readFileSync(pid, 'utf8').trim()).toBe(String(child.proc.pid));
      const c = await LegacyClient.connect(sock);
      expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
      expect(await child.stop(sig)).toBe(0);
      await c.whenClosed();
      expect(fs.existsSync(sock)).toBe(false);
      expect(fs.existsSync(pid)).toBe(false);
      // and a restart on the same paths just works
      const again = track(await startHelper(['-k', sock, '-f', pid, ...hostArgs(host)]));
      expect(await again.stop()).toBe(0);
    });
  }

  test('stop() called in-process removes the signal handlers runDaemon installed', async () => {
    const { host, sock } = setup();
    ensureBuilt();
    // in a child: runDaemon drops privileges of the process it runs in
    const script = `
      const { runDaemon } = await import(${JSON.stringify(path.join(ROOT, 'dist/src/helper/daemon.js'))});
      const { parseDaemonOptions } = await import(${JSON.stringify(path.join(ROOT, 'dist/src/cli/commands/start-daemon.js'))});
      const count = () => ['SIGTERM', 'SIGINT', 'SIGHUP'].map((s) => process.listenerCount(s)).join(',');
      const before = count();
      const d = await runDaemon(parseDaemonOptions(${JSON.stringify({ socket: sock, msrPath: host.msrPathTemplate, sysRoot: host.sysRoot, vendor: 'intel', quiet: true })}));
      const during = count();
      await d.stop();
      console.log(JSON.stringify({ before, during, after: count() }));`;
    const out = execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
    expect(JSON.parse(out)).toEqual({ before: '0,0,0', during: '1,1,1', after: '0,0,0' });
  });
});

describe('pidfile and socket file', () => {
  test('a second instance with the same pidfile is refused; the first keeps serving', async () => {
    const { host, dir, sock, pid } = setup();
    const first = track(await startHelper(['-k', sock, '-f', pid, ...hostArgs(host)]));
    const other = path.join(dir, 'other.sock');
    const second = track(spawnHelper(['-k', other, '-f', pid, ...hostArgs(host)]));
    expect(await second.exited).toBe(1);
    expect(second.stderr()).toContain(
      `cannot create pidfile ${pid}: another instance is running (pid ${first.proc.pid}); stop it or choose another pidfile with -f`,
    );
    expect(fs.existsSync(other)).toBe(false); // what the refused one bound, it removed
    expect(fs.readFileSync(pid, 'utf8').trim()).toBe(String(first.proc.pid));
    const c = await LegacyClient.connect(sock);
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    c.close();
  });

  test('a stale pidfile (dead process) and a stale socket (nobody listening) are replaced', async () => {
    const { host, sock, pid } = setup();
    const dead = spawn('true');
    await new Promise((r) => dead.on('exit', r));
    fs.writeFileSync(pid, `${dead.pid}\n`);
    // a socket file left by a killed listener
    const holder = spawn(process.execPath, [
      '-e',
      `require('net').createServer().listen(${JSON.stringify(sock)}, () => console.log('up'))`,
    ]);
    await new Promise((r) => holder.stdout.once('data', r));
    holder.kill('SIGKILL');
    await new Promise((r) => holder.on('exit', r));
    expect(fs.statSync(sock).isSocket()).toBe(true);
    const child = track(await startHelper(['-k', sock, '-f', pid, ...hostArgs(host)]));
    expect(fs.readFileSync(pid, 'utf8').trim()).toBe(String(child.proc.pid));
    const c = await LegacyClient.connect(sock);
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    c.close();
  });

  test('a live socket is an error, and is left to its owner', async () => {
    const { host, sock } = setup();
    track(await startHelper(['-k', sock, ...hostArgs(host)]));
    const second = track(spawnHelper(['-k', sock, ...hostArgs(host)]));
    expect(await second.exited).toBe(1);
    expect(second.stderr()).toContain(`another process is already listening on ${sock}; stop it or choose another path with -k`);
    const c = await LegacyClient.connect(sock);
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    c.close();
  });

  test('a live listener whose backlog is full is not mistaken for a stale socket', async () => {
    const { host, sock } = setup();
    // listen(0) and never accept: after one pending connection, connect() gets EAGAIN
    const holder = spawn(
      'python3',
      [
        '-c',
        'import socket,sys,time\ns=socket.socket(socket.AF_UNIX);s.bind(sys.argv[1]);s.listen(0);print("up",flush=True);time.sleep(60)',
        sock,
      ],
      { stdio: ['ignore', 'pipe', 'ignore'] },
    );
    cleanups.push(() => {
      holder.kill('SIGKILL');
    });
    await new Promise((r) => holder.stdout.once('data', r));
    const ino = fs.statSync(sock).ino;
    for (let full = false; !full;) {
      full = await new Promise<boolean>((resolve) => {
        const c = net.connect({ path: sock });
        cleanups.push(() => {
          c.destroy();
        });
        c.once('connect', () => resolve(false));
        c.once('error', (e: NodeJS.ErrnoException) => resolve(e.code === 'EAGAIN'));
      });
    }
    const child = track(spawnHelper(['-k', sock, ...hostArgs(host)]));
    expect(await child.exited).toBe(1);
    expect(child.stderr()).toContain(`another process is already listening on ${sock}`);
    expect(fs.statSync(sock).ino).toBe(ino);
  });

  test('a file that is not a socket is never removed', async () => {
    const { host, sock } = setup();
    fs.writeFileSync(sock, 'precious');
    const child = track(spawnHelper(['-k', sock, ...hostArgs(host)]));
    expect(await child.exited).toBe(1);
    expect(child.stderr()).toContain('exists and is not a socket');
    expect(fs.readFileSync(sock, 'utf8')).toBe('precious');
  });
});

describe('memory', () => {
  test('once listening, the daemon gives back what start-up used (most of it node binary pages) and answers as before', async () => {
    const { host, sock } = setup();
    const child = track(await startHelper(['-k', sock, ...hostArgs(host)]));
    await waitFor(() => child.stderr().includes('memory given back after start-up'), 'the start-up memory settle', child);
    const line = child
      .stderr()
      .split('\n')
      .find((l) => l.includes('memory given back after start-up'))!;
    const { rssBeforeMb, rssAfterMb } = JSON.parse(line) as { rssBeforeMb: number; rssAfterMb: number };
    expect(rssAfterMb).toBeLessThan(rssBeforeMb - 10);
    const c = await LegacyClient.connect(sock);
    for (let i = 0; i < 100; i++) expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    c.close();
    const rss = Number(/^VmRSS:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${child.proc.pid}/status`, 'utf8'))![1]) / 1024;
    expect(rss).toBeLessThan(rssBeforeMb);
    console.log(`start-up RSS ${rssBeforeMb} MB -> ${rssAfterMb} MB after the settle, ${rss.toFixed(0)} MB after 100 legacy requests`);
  });
});

describe('-d', () => {
  test('the foreground process exits 0 once the detached child serves; SIGTERM cleans up', async () => {
    const { host, dir, sock, pid } = setup();
    ensureBuilt();
    // --log-file in the test's directory: -d alone would log to /var/log (log-file.daemon.test.ts).
    const log = path.join(dir, 'h.log');
    const out = execFileSync(process.execPath, [BIN, '-d', '-k', sock, '-f', pid, '--log-file', log, ...hostArgs(host)], {
      encoding: 'utf8',
      timeout: 20_000,
    });
    expect(out).toBe('');
    const daemonPid = Number(fs.readFileSync(pid, 'utf8').trim());
    cleanups.push(() => {
      try {
        process.kill(daemonPid, 'SIGKILL');
      } catch {
        /* gone */
      }
    });
    expect(fs.readFileSync(`/proc/${daemonPid}/cmdline`, 'utf8')).toContain('vmsr-helper.js');
    // a new session, detached from us
    const stat = fs.readFileSync(`/proc/${daemonPid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    expect(Number(fields[3])).toBe(daemonPid); // session id (field 6) = its own pid
    const c = await LegacyClient.connect(sock);
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    c.close();
    process.kill(daemonPid, 'SIGTERM');
    await waitFor(() => processEnded(daemonPid), 'the daemon to exit');
    await waitFor(() => !fs.existsSync(sock) && !fs.existsSync(pid), 'socket and pidfile removal');
  });

  test("the foreground process exits 1 with the child's start-up error", async () => {
    const { dir, sock } = setup();
    ensureBuilt();
    let err = '';
    let code = 0;
    try {
      execFileSync(
        process.execPath,
        [
          BIN,
          '-d',
          '-k',
          sock,
          '-f',
          path.join(dir, 'p'),
          '--log-file',
          path.join(dir, 'h.log'),
          '--vendor',
          'intel',
          '--msr-path',
          path.join(dir, 'nope/%u/msr'),
        ],
        {
          encoding: 'utf8',
          stdio: 'pipe',
          timeout: 20_000,
        },
      );
    } catch (e) {
      const x = e as { status: number; stderr: string };
      code = x.status;
      err = x.stderr;
    }
    expect(code).toBe(1);
    // --energy-source auto (the default): neither MSR device nor powercap zone opens; the error says what
    // this host lacks, names modprobe msr and the powercap driver, and offers the synthetic source and the demo
    expect(err).toMatch(
      /cannot find an energy source: .*\(.*nope\/0\/msr: ENOENT\); no powercap RAPL zone opens .*load the msr driver with 'modprobe msr', or load the powercap RAPL driver with 'modprobe intel_rapl_msr'/,
    );
    expect(err).toMatch(/--energy-source synthetic .* or 'vmsr-helper demo'/);
  });
});

describe('privileges', () => {
  test('-u nobody: uid/gid 65534, every capability set 0 and NoNewPrivs on every thread; still serving from the fds opened before', async (ctx) => {
    const why = missing({ root: true });
    if (why) return ctx.skip(why);
    const { host, sock } = setup();
    fs.chmodSync(host.dir, 0o755); // like /sys, the fake sysfs is readable by anyone (the helper re-reads it as nobody)
    const child = track(await startHelper(['-k', sock, '-u', 'nobody', ...hostArgs(host)]));
    const st = parseProcStatus(fs.readFileSync(`/proc/${child.proc.pid}/status`, 'utf8'));
    expect(st.uid).toEqual([65534, 65534, 65534, 65534]);
    expect(st.gid).toEqual([65534, 65534, 65534, 65534]);
    expect(st.groups).toEqual([65534]);
    expect([st.capEff, st.capPrm, st.capBnd, st.noNewPrivs]).toEqual([0n, 0n, 0n, 1]);
    // The helper dropped on its main thread and re-executed itself, so every thread (Node's V8 and
    // libuv threads included) has the same credentials: nothing.
    const tids = fs.readdirSync(`/proc/${child.proc.pid}/task`);
    expect(tids.length).toBeGreaterThan(1);
    for (const tid of tids) {
      const t = parseProcStatus(fs.readFileSync(`/proc/${child.proc.pid}/task/${tid}/status`, 'utf8'));
      expect([tid, t.uid, t.gid, t.groups]).toEqual([tid, [65534, 65534, 65534, 65534], [65534, 65534, 65534, 65534], [65534]]);
      expect([tid, t.capEff, t.capPrm, t.capBnd, t.capInh, t.capAmb, t.noNewPrivs]).toEqual([tid, 0n, 0n, 0n, 0n, 0n, 1]);
    }
    expect(child.stderr()).toContain('"reexec":"re-executed');
    const c = await LegacyClient.connect(sock);
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n); // fds opened before the drop
    c.close();
  });

  test('without -u: still uid 0, and every thread (not only the main one) holds no capability', async (ctx) => {
    const why = missing({ root: true });
    if (why) return ctx.skip(why);
    const { host, sock } = setup();
    const child = track(await startHelper(['-k', sock, ...hostArgs(host)]));
    const st = parseProcStatus(fs.readFileSync(`/proc/${child.proc.pid}/status`, 'utf8'));
    expect(st.uid[1]).toBe(0);
    expect([st.capEff, st.capBnd]).toEqual([0n, 0n]);
    // The helper re-executed itself (same pid) after emptying the bounding set, so the threads Node
    // starts (V8 workers, the libuv pool) never had root's capabilities.
    const tids = fs.readdirSync(`/proc/${child.proc.pid}/task`);
    expect(tids.length).toBeGreaterThan(1);
    for (const tid of tids) {
      const t = parseProcStatus(fs.readFileSync(`/proc/${child.proc.pid}/task/${tid}/status`, 'utf8'));
      expect([tid, t.capEff, t.capPrm, t.capBnd, t.capInh, t.capAmb, t.noNewPrivs]).toEqual([tid, 0n, 0n, 0n, 0n, 0n, 1]);
    }
    expect(child.stderr()).toContain('privileges dropped');
    expect(child.stderr()).toContain('"reexec":"re-executed');
    expect(child.stderr()).not.toContain('hold other capabilities');
    // The new image runs with the daemon's Node flags (see os/privileges/reexec.ts).
    const cmdline = fs.readFileSync(`/proc/${child.proc.pid}/cmdline`, 'utf8').split('\0');
    for (const flag of DAEMON_NODE_FLAGS) expect(cmdline).toContain(flag);
    // stdio survived the exec: the log above came through it; and it still serves.
    const c = await LegacyClient.connect(sock);
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    c.close();
  });

  test('as root the start-up steps run once, before the re-exec: the re-executed image adopts every one (-T startup)', async (ctx) => {
    const why = missing({ root: true });
    if (why) return ctx.skip(why);
    const { host, sock, pid } = setup();
    const child = track(await startHelper(['-k', sock, '-f', pid, '-T', 'startup', ...hostArgs(host)]));
    const steps = child
      .stderr()
      .split('\n')
      .filter((l) => l.includes('"msg":"start-up step '))
      .map((l) => JSON.parse(l) as { step: string; done: string; how: string; pid: number });
    expect(steps.map((s) => `${s.step}: ${s.done} (${s.how})`)).toEqual(
      ['checks', 'msr', 'listen', 'pidfile', 'files', 'drop'].map((s) => `${s}: ${s === 'files' ? 'not asked' : 'adopted'} (reexec)`),
    );
    expect(steps.every((s) => s.pid === child.proc.pid)).toBe(true);
    expect(fs.readFileSync(pid, 'utf8').trim()).toBe(String(child.proc.pid));
    const c = await LegacyClient.connect(sock);
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    c.close();
  });
});

describe('start-up errors name the fix', () => {
  const cases: [string, (d: { host: FakeHost; dir: string; sock: string }) => string[], RegExp][] = [
    [
      'unsupported vendor',
      ({ host, dir, sock }) => {
        fs.writeFileSync(path.join(dir, 'cpuinfo'), 'processor\t: 0\nvendor_id\t: CyrixInstead\n');
        return ['-k', sock, '--proc-root', dir, '--msr-path', host.msrPathTemplate, '--sys-root', host.sysRoot];
      },
      /cannot serve CPU vendor CyrixInstead: RAPL MSRs are known only for Intel/,
    ],
    [
      'missing MSR devices',
      ({ dir, sock, host }) => ['-k', sock, '--vendor', 'intel', '--sys-root', host.sysRoot, '--msr-path', path.join(dir, 'x/%u/msr')],
      /modprobe msr/,
    ],
    ['relative socket', ({ host }) => ['-k', 'rel.sock', ...hostArgs(host)], /socket path must be absolute/],
    ['bad vendor', ({ host, sock }) => ['-k', sock, ...hostArgs(host), '--vendor', 'via'], /--vendor: expected auto, intel or amd/],
    [
      'unknown user',
      ({ host, sock }) => ['-k', sock, '-u', 'no-such-user-xyz', ...hostArgs(host)],
      /invalid user 'no-such-user-xyz': give an existing user name or a numeric uid/,
    ],
    ['bad template', ({ host, sock }) => ['-k', sock, '--sys-root', host.sysRoot, '--msr-path', '/dev/cpu/msr'], /exactly one %u/],
    ['bad -T', ({ host, sock }) => ['-k', sock, ...hostArgs(host), '-T', 'file=/tmp/x'], /file= is not supported/],
    [
      'interval that lets the counter wrap twice',
      ({ host, sock }) => ['-k', sock, ...hostArgs(host), '--interval', '61'],
      /--interval must be a number of seconds in \[0\.01, 60\].*wrap/,
    ],
    ['unknown option', () => ['--no-such-option'], /unknown option '--no-such-option'/],
    ['missing argument', () => ['-k'], /argument missing/],
  ];
  for (const [name, args, re] of cases) {
    test(name, async () => {
      const d = setup();
      const child = track(spawnHelper(args(d)));
      expect(await child.exited).toBe(1);
      expect(child.stderr()).toMatch(re);
      expect(fs.existsSync(d.sock)).toBe(false);
    });
  }

  test('-V and -h still work', () => {
    ensureBuilt();
    expect(execFileSync(process.execPath, [BIN, '-V'], { encoding: 'utf8' })).toMatch(/^vmsr-helper \d+\.\d+\.\d+/);
    const help = execFileSync(process.execPath, [BIN, '-h'], { encoding: 'utf8' });
    for (const opt of [
      '--socket',
      '--pidfile',
      '--daemon',
      '--user',
      '--group',
      '--verbose',
      '--quiet',
      '--trace',
      '--msr-path',
      '--vendor',
      '--amd-tdp',
    ])
      expect(help).toContain(opt);
  });
});

describe('contrib/systemd units', () => {
  test('systemd-analyze verify accepts both (ExecStart pointed at the built binary)', async (ctx) => {
    const why = missing({ command: 'systemd-analyze' });
    if (why) return ctx.skip(why);
    ensureBuilt();
    const dir = tempDir('vmsr-units-');
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
    for (const f of ['qemu-vmsr-helper.socket', 'qemu-vmsr-helper.service']) {
      let text = fs.readFileSync(path.join(ROOT, 'contrib/systemd', f), 'utf8');
      text = text.replace(/^ExecStart=.*$/m, `ExecStart=${process.execPath} ${BIN}`);
      fs.writeFileSync(path.join(dir, f), text);
    }
    const svc = fs.readFileSync(path.join(dir, 'qemu-vmsr-helper.service'), 'utf8');
    for (const k of [
      'Type=notify',
      'CapabilityBoundingSet=CAP_SYS_RAWIO CAP_SETPCAP',
      'DeviceAllow=char-cpu/msr r',
      'StateDirectory=vmsr-helper',
      'ProtectSystem=strict',
      'NoNewPrivileges=yes',
      'RestrictAddressFamilies=AF_UNIX',
      'WatchdogSec=',
    ])
      expect(svc).toContain(k);
    const sockText = fs.readFileSync(path.join(dir, 'qemu-vmsr-helper.socket'), 'utf8');
    expect(sockText).toContain('ListenStream=/run/qemu-vmsr-helper.sock');
    expect(sockText).toContain('SocketMode=0660');
    expect(sockText).toContain('SocketGroup=kvm');
    const r = execFileSync(
      'sh',
      ['-c', `systemd-analyze verify ${dir}/qemu-vmsr-helper.socket ${dir}/qemu-vmsr-helper.service 2>&1; echo "rc=$?"`],
      { encoding: 'utf8' },
    );
    expect(r.trim()).toBe('rc=0');
  });
});
