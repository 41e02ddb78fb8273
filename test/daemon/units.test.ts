/** The pure parts: legacy framing, protocol choice, AMD mapping, options, activation env, pidfile text. */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import { classifyPreamble, encodeLegacyRequest, LegacyFramer, V2_MAGIC, type LegacyRequest } from '../../src/protocol/legacy.js';
import { legacyPlan, synthValue } from '../../src/msr/legacy-registers.js';
import { parseDaemonOptions, parseTraceOption, type IdLookups } from '../../src/cli/commands/start-daemon.js';
import { inheritFromEnvironment, Notifier, takeActivation } from '../../src/helper/lifecycle/systemd.js';
import { acquirePidfile, pidfileOf } from '../../src/helper/lifecycle/pidfile.js';
import { parseProcStatus } from '../../src/os/privileges/proc-status.js';
import { resolveId } from '../../src/os/privileges/accounts.js';
import { allowedEnvironment, DAEMON_NODE_FLAGS, withDaemonNodeFlags } from '../../src/os/privileges/reexec.js';
import { mayNeedSubcommands } from '../../src/cli/cli.js';
import { areaMatches } from '../../src/helper/daemon.js';
import { OnlineCpus } from '../../src/helper/legacy/legacy-service.js';
import { FakeHost } from '../support/fake-host.js';
import { VERSION } from '../../src/cli/version.js';
import pkg from '../../package.json' with { type: 'json' };

const u32 = fc.integer({ min: 0, max: 0xffffffff });
const request = fc.record({ msr: u32, cpu: u32, tid: u32 });

describe('LegacyFramer', () => {
  test('any split of any request sequence yields exactly those requests, in order', () => {
    fc.assert(
      fc.property(fc.array(request, { maxLength: 30 }), fc.array(fc.integer({ min: 1, max: 40 }), { maxLength: 60 }), (reqs, cuts) => {
        const bytes = Buffer.concat(reqs.map(encodeLegacyRequest));
        const framer = new LegacyFramer();
        const got: LegacyRequest[] = [];
        let o = 0;
        for (const c of cuts) {
          if (o >= bytes.length) break;
          got.push(...framer.push(bytes.subarray(o, o + c)));
          o += c;
        }
        if (o < bytes.length) got.push(...framer.push(bytes.subarray(o)));
        expect(got).toEqual(reqs);
        expect(framer.incomplete).toHaveLength(0);
      }),
    );
  });

  test('a trailing partial request stays buffered until completed', () => {
    const f = new LegacyFramer();
    const b = encodeLegacyRequest({ msr: 0x611, cpu: 3, tid: 42 });
    expect(f.push(b.subarray(0, 11))).toEqual([]);
    expect(f.incomplete).toHaveLength(11);
    expect(f.push(b.subarray(11))).toEqual([{ msr: 0x611, cpu: 3, tid: 42 }]);
  });

  test('little-endian on the wire, as QEMU writes it', () => {
    expect(encodeLegacyRequest({ msr: 0x606, cpu: 1, tid: 0x01020304 })).toEqual(Buffer.from([6, 6, 0, 0, 1, 0, 0, 0, 4, 3, 2, 1]));
  });
});

describe('classifyPreamble', () => {
  test('VMS2 selects v2; a prefix of it waits; anything else is legacy at once', () => {
    expect(classifyPreamble(V2_MAGIC)).toBe('v2');
    expect(classifyPreamble(Buffer.concat([V2_MAGIC, Buffer.from([1, 0])]))).toBe('v2');
    expect(classifyPreamble(Buffer.from('VM'))).toBe('need-more');
    expect(classifyPreamble(Buffer.alloc(0))).toBe('need-more');
    expect(classifyPreamble(Buffer.from([0x06]))).toBe('legacy');
    expect(classifyPreamble(encodeLegacyRequest({ msr: 0x606, cpu: 0, tid: 1 }))).toBe('legacy');
    expect(classifyPreamble(Buffer.from('VMS3'))).toBe('legacy');
  });
});

describe('legacy register mapping', () => {
  test('Intel reads the requested MSR; others are refused', () => {
    for (const m of [0x606, 0x610, 0x611, 0x614]) expect(legacyPlan('intel', m)).toEqual({ kind: 'read', msr: m });
    for (const m of [0, 0x10, 0x612, 0x619, 0x639, 0xc0010299]) expect(legacyPlan('intel', m)).toBeNull();
  });
  test('AMD maps 0x606/0x611 and synthesises 0x610/0x614; AMD numbers themselves are refused', () => {
    expect(legacyPlan('amd', 0x606)).toEqual({ kind: 'read', msr: 0xc0010299 });
    expect(legacyPlan('amd', 0x611)).toEqual({ kind: 'read', msr: 0xc001029b });
    expect(legacyPlan('amd', 0x610)).toMatchObject({ kind: 'synth', field: 'power-limit' });
    expect(legacyPlan('amd', 0x614)).toMatchObject({ kind: 'synth', field: 'power-info' });
    expect(legacyPlan('amd', 0xc001029b)).toBeNull();
  });
  test('synthesised values use the power unit and are never 0', () => {
    const watts = (w: number) => ({ powerLimitWatts: w, tdpWatts: w });
    expect(synthValue('power-info', 0xa1003n, watts(120))).toBe(960n); // 1/8 W units
    expect(synthValue('power-limit', 0xa1003n, watts(120))).toBe(960n | 0x8000n);
    expect(synthValue('power-info', 0n, watts(0.1))).toBe(1n); // at least one unit
    expect(synthValue('power-info', 0xfn, watts(4000))).toBe(0x7fffn); // clamped to the field
  });
});

describe('daemon options', () => {
  const ids: IdLookups = {
    user: (s) => resolveId(s, 'user', 'root:x:0:0::/:/bin/sh\nqemu:x:107:110::/:/bin/false\n'),
    group: (s) => resolveId(s, 'group', 'root:x:0:\nkvm:x:110:\n'),
    primaryGroup: (u) => (u === 107 ? 110 : undefined),
  };
  test('defaults are qemu-vmsr-helper’s', () => {
    const c = parseDaemonOptions({}, ids);
    expect(c).toMatchObject({
      socketPath: '/run/qemu-vmsr-helper.sock',
      socketPathGiven: false,
      pidfile: '/run/qemu-vmsr-helper.pid',
      pidfileGiven: false,
      daemonize: false,
      logLevel: 'info',
      vendor: 'auto',
      hostPaths: { msrPathTemplate: '/dev/cpu/%u/msr', procRoot: '/proc', sysRoot: '/sys' },
      amd: { powerLimitWatts: 120, tdpWatts: 120 },
    });
    expect(c.uid).toBeUndefined();
  });
  test('users and groups by name or number; -u alone takes the primary group', () => {
    expect(parseDaemonOptions({ user: 'qemu' }, ids)).toMatchObject({ uid: 107, gid: 110 });
    expect(parseDaemonOptions({ user: '4242', group: 'kvm' }, ids)).toMatchObject({ uid: 4242, gid: 110 });
    expect(parseDaemonOptions({ group: '5' }, ids)).toMatchObject({ gid: 5 });
    expect(() => parseDaemonOptions({ user: 'nobody-here' }, ids)).toThrow(/invalid user 'nobody-here'/);
    expect(() => parseDaemonOptions({ group: '-1' }, ids)).toThrow(/invalid group '-1'/);
  });
  test('bad values say how to fix them', () => {
    expect(() => parseDaemonOptions({ socket: 'x.sock' }, ids)).toThrow(/must be absolute .* -k \/run/);
    expect(() => parseDaemonOptions({ vendor: 'arm' }, ids)).toThrow(/auto, intel or amd/);
    expect(() => parseDaemonOptions({ msrPath: '/dev/cpu/%u/%u' }, ids)).toThrow(/exactly one %u/);
    expect(() => parseDaemonOptions({ amdTdp: '0' }, ids)).toThrow(/--amd-tdp: expected watts/);
    expect(() => parseDaemonOptions({ amdPowerLimit: 'lots' }, ids)).toThrow(/--amd-power-limit/);
    expect(() => parseDaemonOptions({ pidfile: '' }, ids)).toThrow(/-f\/--pidfile/);
  });
  test('-v/-q, -T patterns and events files', () => {
    expect(parseDaemonOptions({ verbose: true }, ids).logLevel).toBe('debug');
    expect(parseDaemonOptions({ quiet: true }, ids).logLevel).toBe('warn');
    expect(parseTraceOption('legacy', () => '')).toEqual(['legacy']);
    expect(parseTraceOption('enable=sys*,events=/f', () => '# c\nprivileges\n\nv2\n')).toEqual(['sys*', 'privileges', 'v2']);
    expect(() =>
      parseTraceOption('events=/nope', () => {
        throw new Error('ENOENT');
      }),
    ).toThrow(/cannot read events file/);
    expect(() => parseTraceOption('color=1', () => '')).toThrow(/unknown key 'color'/);
    expect(parseDaemonOptions({ trace: ['legacy', 'v*'] }, ids).traceAreas).toEqual(['legacy', 'v*']);
    expect(areaMatches(['v*'], 'v2')).toBe(true);
    expect(areaMatches(['leg'], 'legacy')).toBe(false);
    expect(areaMatches(['*'], 'anything')).toBe(true);
  });
});

describe('socket activation environment', () => {
  test('ours only when LISTEN_PID is our pid', () => {
    expect(takeActivation({ LISTEN_PID: '42', LISTEN_FDS: '1' }, 42)).toEqual({ fds: 1, names: [] });
    expect(takeActivation({ LISTEN_PID: '43', LISTEN_FDS: '1' }, 42)).toBeNull();
    expect(takeActivation({ LISTEN_FDS: '1' }, 42)).toBeNull();
    expect(takeActivation({ LISTEN_PID: '42', LISTEN_FDS: '0' }, 42)).toBeNull();
    expect(takeActivation({ LISTEN_PID: '42', LISTEN_FDS: '2', LISTEN_FDNAMES: 'a:b' }, 42)).toEqual({ fds: 2, names: ['a', 'b'] });
    expect(() => takeActivation({ LISTEN_PID: '42', LISTEN_FDS: 'x' }, 42)).toThrow(/LISTEN_FDS is not a number/);
  });
  test('the fds the helper stored come grouped by name, in fd order; without names every fd is a listening socket', () => {
    const inherit = (fds: string, names?: string) =>
      inheritFromEnvironment(false, { LISTEN_PID: String(process.pid), LISTEN_FDS: fds, ...(names ? { LISTEN_FDNAMES: names } : {}) });
    expect(inherit('3', 'vmsr-c:vmsr-s:vmsr-c')).toEqual({
      how: 'systemd',
      named: new Map([
        ['vmsr-c', [3, 5]],
        ['vmsr-s', [4]],
      ]),
    });
    expect(() => inherit('2')).toThrow(/LISTEN_FDS > 1 is not supported \(got 2\)/);
  });
  test('LISTEN_FDNAMES is refused when its count differs from LISTEN_FDS or a name is not a valid fd name', () => {
    const parse = (n: string, names: string) => () => takeActivation({ LISTEN_PID: '42', LISTEN_FDS: n, LISTEN_FDNAMES: names }, 42);
    expect(parse('2', 'a')).toThrow(/cannot take the fds systemd passed: LISTEN_FDNAMES has 1 names for LISTEN_FDS=2; check/);
    expect(parse('1', 'a:b')).toThrow(/has 2 names for LISTEN_FDS=1/);
    expect(parse('2', 'a:')).toThrow(/the name of fd 4 in LISTEN_FDNAMES it is empty/);
    expect(parse('1', 'x'.repeat(256))).toThrow(/256 characters, at most 255/);
    expect(parse('1', 'tab\there')).toThrow(/outside printable ASCII/);
    expect(parse('1', 'caf\u00e9')).toThrow(/outside printable ASCII/);
    expect(parse('1', 'x'.repeat(255))).not.toThrow();
    expect(() => takeActivation({ LISTEN_PID: '42', LISTEN_FDS: '8193' }, 42)).toThrow(/LISTEN_FDS is 8193, more than 8192/);
    expect(new Notifier({}).storeFds('stats ~!@#$%^&*()', [0])).toBe(false);
    expect(() => new Notifier({}).storeFds('a:b', [0])).toThrow(/colon/);
  });
  test('the variables are removed, even when malformed or not ours', () => {
    for (const env of [
      { LISTEN_PID: '1', LISTEN_FDS: '1', LISTEN_FDNAMES: 'x' },
      { LISTEN_PID: '7', LISTEN_FDS: 'bad' },
    ]) {
      const e: NodeJS.ProcessEnv = { ...env, KEEP: 'me' };
      try {
        takeActivation(e, 7);
      } catch {
        /* malformed */
      }
      expect(e).toEqual({ KEEP: 'me' });
    }
  });
  test('one listening socket, and no -k with it (the fds the helper stored beside it do not count)', () => {
    const inherit = (names: string, socketPathGiven = false) =>
      inheritFromEnvironment(socketPathGiven, {
        LISTEN_PID: String(process.pid),
        LISTEN_FDS: String(names.split(':').length),
        LISTEN_FDNAMES: names,
      });
    expect(() => inherit('a.socket', true)).toThrow(/-k\) cannot be set/);
    expect(() => inherit('a.socket:vmsr-state:b.socket')).toThrow(/got 2 besides 1 stored by the helper/);
    expect(inherit('vmsr-state', true)).toEqual({ how: 'systemd', named: new Map([['vmsr-state', [3]]]) });
  });
  test('watchdog: every WATCHDOG_USEC/2, honouring WATCHDOG_PID', () => {
    const n = new Notifier({ NOTIFY_SOCKET: `/nonexistent-${process.pid}/notify` }, () => {});
    const every = (env: NodeJS.ProcessEnv) => {
      const ms = n.startWatchdog(env, 5);
      n.stopWatchdog();
      return ms;
    };
    expect(every({ WATCHDOG_USEC: '30000000' })).toBe(15_000);
    expect(every({ WATCHDOG_USEC: '30000000', WATCHDOG_PID: '5' })).toBe(15_000);
    expect(every({ WATCHDOG_USEC: '30000000', WATCHDOG_PID: '6' })).toBeNull();
    expect(every({ WATCHDOG_USEC: '0' })).toBeNull();
    expect(every({})).toBeNull();
    expect(new Notifier({}).startWatchdog({ WATCHDOG_USEC: '30000000' }, 5)).toBeNull();
  });
});

describe('small parsers', () => {
  test("VERSION is package.json's, also when the sources are imported (not only from dist/)", () => {
    expect(VERSION).toBe(pkg.version);
  });
  test('pidfile text: one pid is released by its owner only; anything else is refused', () => {
    const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-pidfile-')), 'h.pid');
    try {
      fs.writeFileSync(file, '123\n');
      pidfileOf(file, 124).release();
      expect(fs.existsSync(file)).toBe(true);
      pidfileOf(file, 123).release();
      expect(fs.existsSync(file)).toBe(false);
      for (const bad of ['', 'abc', '-1', '0', '99999999999', '1 2']) {
        fs.writeFileSync(file, bad);
        expect(() => acquirePidfile(file)).toThrow(/it exists and does not hold a pid/);
      }
    } finally {
      fs.rmSync(path.dirname(file), { recursive: true, force: true });
    }
  });
  test('/proc/<pid>/status credentials', () => {
    const s = parseProcStatus(
      'Name:\tx\nUid:\t0\t0\t0\t0\nGid:\t1\t1\t1\t1\nGroups:\t\nCapPrm:\t0000000000020000\nCapEff:\t0000000000020000\nNoNewPrivs:\t1\n',
    );
    expect(s).toMatchObject({ uid: [0, 0, 0, 0], gid: [1, 1, 1, 1], groups: [], capEff: 0x20000n, noNewPrivs: 1 });
  });
  test('online cpus re-read sysfs for an unknown cpu at most once per interval', () => {
    const host = new FakeHost({ packages: [0, 0, 0, 0], online: [0, 1] });
    const online = path.join(host.sysRoot, 'devices/system/cpu/online');
    try {
      let t = 0;
      const c = new OnlineCpus(host.sysRoot, [0, 1], 1000, () => t);
      expect(c.has(1)).toBe(true);
      fs.writeFileSync(online, '0-2\n'); // cpu 2 comes online
      t = 999;
      expect(c.has(2)).toBe(false); // within the interval: no re-read
      t = 1000;
      expect(c.has(2)).toBe(true); // re-read
      fs.writeFileSync(online, '0-3\n');
      expect(c.has(3)).toBe(false); // just re-read
      c.invalidate(); // after a read failure the next unknown cpu may re-read at once
      expect(c.has(3)).toBe(true);
      fs.writeFileSync(online, 'garbage');
      t = 5000;
      expect(c.has(7)).toBe(false); // re-read failed: keeps the last set
      expect(c.has(0)).toBe(true);
      expect(c.has(3)).toBe(true);
    } finally {
      host.cleanup();
    }
  });
});

describe('start-up', () => {
  test('the re-executed daemon gets the Node flags it lacks; allowed flags the user gave node stay as given, others are dropped', () => {
    expect(withDaemonNodeFlags([])).toEqual([...DAEMON_NODE_FLAGS]);
    expect(withDaemonNodeFlags(['--max-semi-space-size=8', '--trace-gc'])).toEqual(['--v8-pool-size=1', '--max-semi-space-size=8']);
    expect(withDaemonNodeFlags(['--v8_pool_size=2'])).toEqual(['--max-semi-space-size=4', '--v8_pool_size=2']);
  });

  test('the re-executed daemon is given no flag that opens a debugger or loads code, whatever node was given', () => {
    const hostile = [
      '--inspect',
      '--inspect=0.0.0.0:9229',
      '--inspect-brk',
      '--inspect-port=9229',
      '--require=/tmp/x.js',
      '-r',
      '/tmp/x.js',
      '--import=/tmp/x.mjs',
      '--loader=/tmp/l.mjs',
      '--experimental-loader=/tmp/l.mjs',
      '--max-old-space-size=64',
    ];
    expect(withDaemonNodeFlags(hostile)).toEqual([...DAEMON_NODE_FLAGS, '--max-old-space-size=64']);
  });

  test('the re-executed daemon inherits only allowlisted variables: NODE_OPTIONS, NODE_PATH and HOME are dropped', () => {
    const env = allowedEnvironment({
      NODE_OPTIONS: '--inspect',
      NODE_PATH: '/tmp',
      HOME: '/root',
      PATH: '/usr/bin',
      LC_ALL: 'C',
      NOTIFY_SOCKET: '/run/n',
      JOURNAL_STREAM: '1:2',
      EVIL: 'x',
    });
    expect(env).toEqual({ PATH: '/usr/bin', LC_ALL: 'C', NOTIFY_SOCKET: '/run/n', JOURNAL_STREAM: '1:2' });
  });

  test('subcommand modules are loaded only when the command line may name one or asks for help', () => {
    expect(mayNeedSubcommands(['-k', '/run/x.sock', '-v'])).toBe(false);
    expect(mayNeedSubcommands([])).toBe(false);
    for (const args of [['record', '--pid', '1'], ['-k', '/x', 'watch'], ['replay'], ['help'], ['-h'], ['--help'], ['-u', 'watch']])
      expect(mayNeedSubcommands(args)).toBe(true);
  });
});
