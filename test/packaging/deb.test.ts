/**
 * The Debian package of `npm run package:deb` (scripts/package-deb.sh), built from a packed tarball,
 * checked as dpkg sees it (control fields, file list, owners and modes), then installed by dpkg
 * into a fresh root (`dpkg --root`, with the few files a root needs: an empty dpkg database, and the
 * /etc/group and /etc/passwd base-passwd would give). There its maintainer scripts run for real:
 * the group is in the root's /etc/group, the units are enabled in the root, and this machine is
 * left as it was; the command runs from there; `systemd-analyze verify --root` checks the installed
 * units; an upgrade keeps a unit the administrator disabled disabled; remove and purge leave what
 * Debian's rules say, QEMU's own units diverted aside while it is installed and back after; lintian
 * finds no error in it. The branches a root install cannot take here (a running systemd, no
 * init-system-helpers) run with the tools they call replaced by recorders.
 *
 * Two dpkg options, and why: `--force-script-chrootless` runs the scripts with this machine's tools
 * and DPKG_ROOT set to the root (the scripts act on DPKG_ROOT), because by default dpkg runs them
 * chrooted into the root, and a fresh root has no shell, groupadd or deb-systemd-helper; and
 * `--force-depends`, because the fresh root's database holds no nodejs or passwd package (this
 * machine's node and groupadd are used instead).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { ROOT, tempDir } from '../daemon/support/daemon-process.js';
import { missing } from '../support/env.js';
import { packTarball } from './support/packed.js';

const UNITS = ['qemu-vmsr-helper.socket', 'qemu-vmsr-helper.service', 'vmsr-helper-exporter.service'];
const SCRIPTS = ['preinst', 'postinst', 'prerm', 'postrm'];
/** Where the units go: Debian's place for a package's units. */
const UNIT_DIR = 'usr/lib/systemd/system';
/** QEMU's units of the same names (qemu-system-common), which preinst diverts aside. */
const QEMU_UNITS = ['qemu-vmsr-helper.socket', 'qemu-vmsr-helper.service'];
const QEMU_UNIT_TEXT = "# qemu-system-common's own unit\n";
const LIB = 'usr/lib/vmsr-helper';

function run(cmd: string, args: string[], env?: NodeJS.ProcessEnv): string {
  return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], ...(env ? { env } : {}) });
}

/** A symbolic link is there (its target, absolute inside the root, need not exist on this machine). */
function isLink(p: string): boolean {
  return fs.lstatSync(p, { throwIfNoEntry: false })?.isSymbolicLink() ?? false;
}

/**
 * A root dpkg can install into: an empty database (status, available, info/, updates/,
 * triggers/), and what base-passwd gives every Debian system before anything else is installed
 * (root in /etc/group and /etc/passwd), which groupadd --prefix needs.
 */
function freshRoot(root: string): void {
  const db = path.join(root, 'var/lib/dpkg');
  for (const d of ['info', 'updates', 'triggers']) fs.mkdirSync(path.join(db, d), { recursive: true });
  for (const f of ['status', 'available']) fs.writeFileSync(path.join(db, f), '');
  fs.mkdirSync(path.join(root, 'etc'), { recursive: true });
  fs.writeFileSync(path.join(root, 'etc/group'), 'root:x:0:\n');
  fs.writeFileSync(path.join(root, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\n');
}

describe('the Debian package', () => {
  const why =
    missing({ root: true }) ??
    missing({ command: 'npm' }) ??
    missing({ command: 'dpkg-deb' }) ??
    missing({ command: 'dpkg' }) ??
    missing({ command: 'groupadd' }) ??
    missing({ command: 'deb-systemd-helper' });
  let dir = '';
  let deb = '';
  let root = '';
  /** What this machine had before the install: its groups and its units in /etc. */
  let before = { group: '', units: [] as string[] };
  const hostState = () => ({ group: fs.readFileSync('/etc/group', 'utf8'), units: fs.readdirSync('/etc/systemd/system').sort() });
  const dpkg = (args: string[]) => run('dpkg', [`--root=${root}`, '--force-script-chrootless', '--force-depends', ...args]);

  beforeAll(() => {
    if (why) return;
    dir = tempDir('vmsr-deb-');
    const tarball = packTarball(dir);
    deb = run('sh', [path.join(ROOT, 'scripts/package-deb.sh'), '--tarball', tarball, '--out', dir])
      .trim()
      .split('\n')
      .at(-1)!;
    root = path.join(dir, 'root');
    freshRoot(root);
    before = hostState();
    // QEMU's own units, as qemu-system-common leaves them: diverted aside by the install, back after removal.
    fs.mkdirSync(path.join(root, UNIT_DIR), { recursive: true });
    for (const u of QEMU_UNITS) fs.writeFileSync(path.join(root, UNIT_DIR, u), QEMU_UNIT_TEXT);
    dpkg(['-i', deb]);
  }, 300_000);
  afterAll(() => {
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  test('npm run package:deb runs the script this file runs', () => {
    const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
    expect(pkg.scripts['package:deb']).toBe('sh scripts/package-deb.sh');
  });

  test('its control names the version, this architecture and Node 20 or newer, and /etc/default/vmsr-helper is a conffile', (ctx) => {
    if (why) return ctx.skip(why);
    const version = (JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
    const arch = run('dpkg', ['--print-architecture']).trim();
    expect(path.basename(deb)).toBe(`vmsr-helper_${version}_${arch}.deb`);
    const field = (f: string) => run('dpkg-deb', ['-f', deb, f]).trim();
    expect(field('Package')).toBe('vmsr-helper');
    expect(field('Version')).toBe(version);
    expect(field('Architecture')).toBe(arch);
    expect(field('Depends')).toMatch(/^nodejs \(>= 20\), passwd, libc6 \(>= 2\.\d+\), libcrypt1$/);
    // A real maintainer, the one of the changelog's last entry (not root@localhost).
    expect(field('Maintainer')).toBe(
      run('dpkg-parsechangelog', ['-l', path.join(ROOT, 'contrib/debian/changelog'), '-SMaintainer']).trim(),
    );
    expect(field('Maintainer')).not.toMatch(/root@|localhost|example\.(org|com|net)|\.invalid>|\.example>/);
    expect(Number(field('Installed-Size'))).toBeGreaterThan(1000);
    const info = run('dpkg-deb', ['-I', deb]);
    for (const s of SCRIPTS) expect(info, s).toMatch(new RegExp(`\\b${s}\\s+#!/bin/sh`));
    expect(run('dpkg-deb', ['--ctrl-tarfile', deb]).length).toBeGreaterThan(0);
    const control = path.join(dir, 'control');
    run('dpkg-deb', ['-e', deb, control]);
    expect(fs.readFileSync(path.join(control, 'conffiles'), 'utf8')).toBe('/etc/default/vmsr-helper\n');
  });

  test('its files are owned by root with the modes Debian expects, and hold production modules only', (ctx) => {
    if (why) return ctx.skip(why);
    const list = run('dpkg-deb', ['-c', deb])
      .split('\n')
      .filter(Boolean)
      .map((l) => {
        const [mode, owner, , , , ...rest] = l.split(/\s+/);
        return {
          mode: mode!,
          owner: owner!,
          name: rest
            .join(' ')
            .replace(/^\.\//, '')
            .replace(/ -> .*$/, ''),
        };
      });
    const byName = new Map(list.map((e) => [e.name, e]));
    expect(list.filter((e) => e.owner !== 'root/root')).toEqual([]);
    expect(byName.get('usr/bin/vmsr-helper')?.mode).toBe('lrwxrwxrwx');
    expect(byName.get(`${LIB}/dist/src/bin/vmsr-helper.js`)?.mode).toBe('-rwxr-xr-x');
    for (const u of UNITS) expect(byName.get(`${UNIT_DIR}/${u}`)?.mode, u).toBe('-rw-r--r--');
    expect(list.filter((e) => e.name.startsWith('etc/systemd/'))).toEqual([]);
    // The man page and the completion where man and bash look; the changelog; nothing twice or foreign.
    for (const f of [
      'usr/share/man/man1/vmsr-helper.1.gz',
      'usr/share/bash-completion/completions/vmsr-helper',
      'usr/share/doc/vmsr-helper/changelog.gz',
      'usr/share/lintian/overrides/vmsr-helper',
    ])
      expect(byName.get(f)?.mode, f).toBe('-rw-r--r--');
    expect(list.filter((e) => /\/musl_[^/]*\/|\.npmignore$|\.html$|\/contrib\/debian\//.test(e.name)).map((e) => e.name)).toEqual([]);
    expect(list.filter((e) => e.name.endsWith('.node') && e.mode !== '-rw-r--r--').map((e) => e.name)).toEqual([]);
    // Dated by the changelog, not npm's 1985-10-26.
    expect(run('dpkg-deb', ['-c', deb]).match(/ 1985-/g)).toBeNull();
    expect(byName.get('etc/default/vmsr-helper')?.mode).toBe('-rw-r--r--');
    expect(byName.get('usr/share/doc/vmsr-helper/copyright')?.mode).toBe('-rw-r--r--');
    expect(byName.has('usr/share/doc/vmsr-helper/docs/try-it.md')).toBe(true);
    expect(list.filter((e) => e.mode.startsWith('d') && e.mode !== 'drwxr-xr-x')).toEqual([]);
    expect(list.filter((e) => /(^|\/)(test|bench)\//.test(e.name) && !e.name.includes('/node_modules/'))).toEqual([]);
    // Nor the modules' own tests, benchmarks, examples, TypeScript declarations or source maps.
    const modules = list.filter((e) => e.name.includes('/node_modules/')).map((e) => e.name);
    expect(modules.length).toBeGreaterThan(50);
    expect(
      modules.filter((n) =>
        /\/node_modules\/(@[^/]+\/)?[^/]+\/(test|tests|__tests__|benchmarks?|examples?|\.github)\/|\.(d\.)?[mc]?ts$|\.map$/.test(n),
      ),
    ).toEqual([]);
    for (const dev of ['typescript', 'vitest', 'eslint', 'prettier', 'fast-check', '@types/node']) {
      expect(byName.has(`${LIB}/node_modules/${dev}/`), dev).toBe(false);
    }
    for (const dep of ['koffi', 'pino', 'commander', 'prom-client', 'yaml'])
      expect(byName.has(`${LIB}/node_modules/${dep}/package.json`), dep).toBe(true);
  });

  test('lintian finds no error and at most 5 warnings in it, and each override it ships has its reason written beside it', (ctx) => {
    if (why) return ctx.skip(why);
    const noLintian = missing({ command: 'lintian' });
    if (noLintian) return ctx.skip(`${noLintian} (apt-get install lintian; .ci/run does)`);
    const r = spawnSync('lintian', ['--fail-on', 'error', deb], { encoding: 'utf8', timeout: 240_000 });
    const tags = r.stdout.split('\n').filter((l) => /^[EW]: /.test(l));
    expect(
      tags.filter((l) => l.startsWith('E: ')),
      r.stdout + r.stderr,
    ).toEqual([]);
    expect(r.status, r.stdout + r.stderr).toBe(0);
    console.log(`lintian: ${tags.length} errors and warnings${tags.length > 0 ? `:\n${tags.join('\n')}` : ''}`);
    expect(tags.filter((l) => l.startsWith('W: ')).length, r.stdout).toBeLessThanOrEqual(5);
    // Each override line follows a comment that says why.
    const lines = fs.readFileSync(path.join(ROOT, 'contrib/debian/lintian-overrides'), 'utf8').split('\n');
    lines.forEach((l, i) => {
      if (l.startsWith('vmsr-helper:')) expect(lines[i - 1], l).toMatch(/^# /);
    });
  });

  test('dpkg --root installs it into a fresh root: its database lists it installed, with its files and its conffile, and this machine is unchanged', (ctx) => {
    if (why) return ctx.skip(why);
    const status = dpkg(['-s', 'vmsr-helper']);
    expect(status).toMatch(/^Status: install ok installed$/m);
    expect(status).toMatch(/^Conffiles:\n \/etc\/default\/vmsr-helper [0-9a-f]{32}$/m);
    const files = new Set(dpkg(['-L', 'vmsr-helper']).trim().split('\n'));
    for (const f of [
      '/usr/bin/vmsr-helper',
      `/${LIB}/dist/src/bin/vmsr-helper.js`,
      '/etc/default/vmsr-helper',
      ...UNITS.map((u) => `/${UNIT_DIR}/${u}`),
    ]) {
      expect(files.has(f), f).toBe(true);
      expect(fs.existsSync(path.join(root, f)), f).toBe(true);
    }
    for (const s of SCRIPTS) expect(fs.existsSync(path.join(root, 'var/lib/dpkg/info', `vmsr-helper.${s}`)), s).toBe(true);
    // QEMU's units of the same names are diverted aside, kept as they were.
    const diversions = run('dpkg-divert', [`--root=${root}`, '--list', 'vmsr-helper']);
    for (const u of QEMU_UNITS) {
      expect(diversions).toContain(`diversion of /${UNIT_DIR}/${u} to /${UNIT_DIR}/${u}.qemu-system-common by vmsr-helper`);
      expect(fs.readFileSync(path.join(root, UNIT_DIR, `${u}.qemu-system-common`), 'utf8')).toBe(QEMU_UNIT_TEXT);
      expect(fs.readFileSync(path.join(root, UNIT_DIR, u), 'utf8')).not.toBe(QEMU_UNIT_TEXT);
    }
    // The scripts acted on the root only: no group, no unit, no enablement on this machine.
    expect(hostState()).toEqual(before);
  });

  test('its postinst ran in the root: the vmsr-observers group (a system gid), the socket and the exporter enabled, the service left to the socket', (ctx) => {
    if (why) return ctx.skip(why);
    const group = fs.readFileSync(path.join(root, 'etc/group'), 'utf8');
    const m = /^vmsr-observers:x:(\d+):$/m.exec(group);
    expect(m, group).not.toBeNull();
    expect(Number(m![1])).toBeGreaterThan(0);
    expect(Number(m![1])).toBeLessThan(1000);
    const wants = (target: string, unit: string) => path.join(root, 'etc/systemd/system', `${target}.wants`, unit);
    expect(fs.readlinkSync(wants('sockets.target', 'qemu-vmsr-helper.socket'))).toBe(`/${UNIT_DIR}/qemu-vmsr-helper.socket`);
    expect(fs.readlinkSync(wants('multi-user.target', 'vmsr-helper-exporter.service'))).toBe(`/${UNIT_DIR}/vmsr-helper-exporter.service`);
    // deb-systemd-helper's state, so that an upgrade knows they were enabled.
    const state = path.join(root, 'var/lib/systemd/deb-systemd-helper-enabled');
    expect(fs.existsSync(path.join(state, 'sockets.target.wants/qemu-vmsr-helper.socket'))).toBe(true);
    expect(fs.existsSync(path.join(state, 'multi-user.target.wants/vmsr-helper-exporter.service'))).toBe(true);
    // The service itself is socket-activated: enabling the socket is enough (Also= in its [Install]).
    expect(isLink(wants('multi-user.target', 'qemu-vmsr-helper.service'))).toBe(false);
    // The default file is the shipped one.
    expect(fs.readFileSync(path.join(root, 'etc/default/vmsr-helper'), 'utf8')).toBe(
      fs.readFileSync(path.join(ROOT, 'contrib/debian/default'), 'utf8'),
    );
  });

  test('installed into a fresh root, its command runs from there with its own modules', (ctx) => {
    if (why) return ctx.skip(why);
    const bin = path.join(root, 'usr/bin/vmsr-helper');
    expect(fs.realpathSync(bin)).toBe(path.join(fs.realpathSync(root), LIB, 'dist/src/bin/vmsr-helper.js'));
    expect(run(bin, ['--version']).trim()).toMatch(/^vmsr-helper \d+\.\d+\.\d+/);
    expect(run(bin, ['--help'])).toMatch(/^Usage: vmsr-helper/m);
    // koffi's native part loads (the replay of the bundled trace needs none, the daemon's libc calls do).
    expect(run(bin, ['replay'])).toMatch(/vm-spin/);
    // man finds its page where the package put it, and bash takes its completion.
    if (!missing({ command: 'man' })) {
      const man = spawnSync('man', ['vmsr-helper'], {
        env: { ...process.env, MANPATH: path.join(root, 'usr/share/man'), MANPAGER: 'cat', PAGER: 'cat' },
        encoding: 'utf8',
      });
      expect(man.stdout, man.stderr).toMatch(/VMSR-HELPER\(1\)/);
    }
    const completion = path.join(root, 'usr/share/bash-completion/completions/vmsr-helper');
    expect(run('bash', ['-c', 'source "$1" && complete -p vmsr-helper', 'bash', completion])).toMatch(/^complete .* vmsr-helper$/m);
    const s = tempDir();
    try {
      const out = execFileSync(bin, ['--energy-source', 'synthetic', '-k', `${s}/s.sock`, '-f', `${s}/pid`], {
        encoding: 'utf8',
        timeout: 3000,
        killSignal: 'SIGTERM',
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      expect(out).toBe('');
    } catch (e) {
      // Ended by the timeout's SIGTERM after it served: its log says it listened.
      const err = e as { stderr?: string; signal?: string };
      expect(err.stderr ?? '', String(e)).toContain(`Listening on ${s}/s.sock`);
    } finally {
      fs.rmSync(s, { recursive: true, force: true });
    }
  });

  test('the installed units read the default file, whose options reach ExecStart', (ctx) => {
    if (why) return ctx.skip(why);
    const helper = fs.readFileSync(path.join(root, UNIT_DIR, 'qemu-vmsr-helper.service'), 'utf8');
    const exporter = fs.readFileSync(path.join(root, UNIT_DIR, 'vmsr-helper-exporter.service'), 'utf8');
    for (const u of [helper, exporter]) expect(u).toMatch(/^\[Service\]\n#.*\nEnvironmentFile=-\/etc\/default\/vmsr-helper$/m);
    expect(helper).toMatch(/^ExecStart=vmsr-helper \$VMSR_HELPER_OPTS$/m);
    expect(exporter).toMatch(/^ExecStart=vmsr-helper exporter .* \$VMSR_EXPORTER_OPTS$/m);
    // Otherwise the units are contrib/systemd's.
    const strip = (t: string) =>
      t
        .split('\n')
        .filter((l) => !l.startsWith('EnvironmentFile=') && !l.startsWith('# Options from the default file'))
        .map((l) => l.replace(/ \$VMSR_[A-Z_]+_OPTS$/, ''))
        .join('\n');
    for (const u of UNITS) {
      expect(strip(fs.readFileSync(path.join(root, UNIT_DIR, u), 'utf8')), u).toBe(
        fs.readFileSync(path.join(ROOT, 'contrib/systemd', u), 'utf8'),
      );
    }
    const defaults = fs.readFileSync(path.join(root, 'etc/default/vmsr-helper'), 'utf8');
    expect(defaults).toMatch(/^VMSR_HELPER_OPTS="--observer-group vmsr-observers"$/m);
    expect(defaults).toMatch(/^VMSR_EXPORTER_OPTS=""$/m);
  });

  test('systemd-analyze verify --root accepts the installed units', (ctx) => {
    if (why) return ctx.skip(why);
    const noVerify = missing({ command: 'systemd-analyze' });
    if (noVerify) return ctx.skip(noVerify);
    if (!fs.existsSync('/usr/lib/systemd/system/sysinit.target'))
      return ctx.skip('no /usr/lib/systemd/system/sysinit.target to verify against');
    // The distribution's units (sysinit.target, modprobe@.service) and /bin/kill (ExecReload=), as on a Debian host.
    fs.cpSync('/usr/lib/systemd/system', path.join(root, 'usr/lib/systemd/system'), {
      recursive: true,
      verbatimSymlinks: true,
      force: false,
    });
    fs.mkdirSync(path.join(root, 'bin'), { recursive: true });
    fs.copyFileSync(fs.realpathSync('/bin/kill'), path.join(root, 'bin/kill'));
    fs.chmodSync(path.join(root, 'bin/kill'), 0o755);
    const out = run('sh', ['-c', `systemd-analyze verify --root="$1" ${UNITS.join(' ')} 2>&1; echo "rc=$?"`, 'sh', root]).trim();
    expect(out).toBe('rc=0');
  });

  test('the systemd-analyze verify recipe of docs/packaging.md, run as written beside the .deb, accepts the units', (ctx) => {
    if (why) return ctx.skip(why);
    const noVerify = missing({ command: 'systemd-analyze' });
    if (noVerify) return ctx.skip(noVerify);
    const doc = fs.readFileSync(path.join(ROOT, 'docs/packaging.md'), 'utf8');
    const block = /```sh\n(D=\$\(mktemp -d\)\n[\s\S]*?)```/.exec(doc)![1]!;
    expect(block).toContain('systemd-analyze verify --root="$D"');
    const r = spawnSync('sh', ['-ec', block], { cwd: path.dirname(deb), encoding: 'utf8', timeout: 120_000 });
    expect(r.status, r.stdout + r.stderr).toBe(0);
    expect((r.stdout + r.stderr).trim()).toBe('');
  });

  test('the maintainer scripts parse, and take the branches a root install cannot here (a running systemd, no init-system-helpers) with recorders in place of the tools', (ctx) => {
    if (why) return ctx.skip(why);
    const control = path.join(dir, 'scripts');
    run('dpkg-deb', ['-e', deb, control]);
    for (const s of SCRIPTS) run('sh', ['-n', path.join(control, s)]);
    // Recorders in place of the tools the scripts call; getent says the group does not exist yet.
    const stubs = path.join(dir, 'stubs');
    const log = path.join(dir, 'calls.log');
    fs.mkdirSync(stubs);
    for (const tool of ['groupadd', 'deb-systemd-helper', 'deb-systemd-invoke', 'systemctl', 'dpkg-divert']) {
      // was-enabled: true on a first install (deb-systemd-helper has no state yet), false when WAS_DISABLED is set.
      const wasEnabled = `[ "$1 $2" != "--quiet was-enabled" ] || [ -z "$WAS_DISABLED" ] || exit 1`;
      fs.writeFileSync(path.join(stubs, tool), `#!/bin/sh\necho "${tool} $*" >> "${log}"\n${wasEnabled}\nexit 0\n`, { mode: 0o755 });
    }
    fs.writeFileSync(path.join(stubs, 'getent'), `#!/bin/sh\necho "getent $*" >> "${log}"\nexit 2\n`, { mode: 0o755 });
    const env = { PATH: `${stubs}:/usr/bin:/bin`, DPKG_ROOT: '' };
    run('sh', [path.join(control, 'postinst'), 'configure', ''], env);
    const calls = fs.readFileSync(log, 'utf8').trim().split('\n');
    expect(calls.slice(0, 2)).toEqual(['getent group vmsr-observers', 'groupadd --system vmsr-observers']);
    for (const unit of ['qemu-vmsr-helper.socket', 'vmsr-helper-exporter.service']) {
      expect(calls, unit).toContain(`deb-systemd-helper unmask ${unit}`);
      expect(calls, unit).toContain(`deb-systemd-helper --quiet was-enabled ${unit}`);
      expect(calls, unit).toContain(`deb-systemd-helper enable ${unit}`);
    }
    // The service itself is socket-activated: enabling the socket is enough (Also= in its [Install]).
    expect(calls.some((c) => c.includes('enable qemu-vmsr-helper.service'))).toBe(false);
    const systemdRuns = fs.existsSync('/run/systemd/system');
    expect(calls.includes('deb-systemd-invoke restart qemu-vmsr-helper.socket'), `systemd running: ${systemdRuns}`).toBe(systemdRuns);
    // An upgrade where the administrator had disabled them: the state is updated, nothing enabled.
    fs.writeFileSync(log, '');
    run('sh', [path.join(control, 'postinst'), 'configure', '0.0.1'], { ...env, WAS_DISABLED: '1' });
    const upgrade = fs.readFileSync(log, 'utf8');
    expect(upgrade).toContain('deb-systemd-helper update-state qemu-vmsr-helper.socket');
    expect(upgrade).not.toContain('deb-systemd-helper enable');
    // With a root given to dpkg (DPKG_ROOT), nothing is started, whatever runs on this machine.
    fs.writeFileSync(log, '');
    run('sh', [path.join(control, 'postinst'), 'configure', ''], { ...env, DPKG_ROOT: '/some/root' });
    expect(fs.readFileSync(log, 'utf8')).not.toMatch(/deb-systemd-invoke|systemctl/);
    // Without the tools (no init-system-helpers), postinst still succeeds.
    fs.writeFileSync(log, '');
    for (const tool of ['deb-systemd-helper', 'deb-systemd-invoke', 'systemctl']) fs.rmSync(path.join(stubs, tool));
    const bare = path.join(dir, 'bare');
    fs.mkdirSync(bare);
    for (const t of ['sh', 'groupadd', 'getent'])
      fs.symlinkSync(t === 'sh' ? fs.realpathSync('/bin/sh') : path.join(stubs, t), path.join(bare, t));
    run(path.join(bare, 'sh'), [path.join(control, 'postinst'), 'configure', ''], { PATH: bare });
    expect(fs.readFileSync(log, 'utf8').trim().split('\n')).toEqual(['getent group vmsr-observers', 'groupadd --system vmsr-observers']);
    // prerm and postrm on remove and purge, the same recorders: no failure, and purge forgets the units.
    for (const tool of ['deb-systemd-helper', 'deb-systemd-invoke', 'systemctl']) {
      fs.writeFileSync(path.join(stubs, tool), `#!/bin/sh\necho "${tool} $*" >> "${log}"\nexit 0\n`, { mode: 0o755 });
    }
    fs.writeFileSync(log, '');
    run('sh', [path.join(control, 'preinst'), 'install'], env);
    for (const u of QEMU_UNITS)
      expect(fs.readFileSync(log, 'utf8')).toContain(
        `dpkg-divert --package vmsr-helper --rename --divert /${UNIT_DIR}/${u}.qemu-system-common --add /${UNIT_DIR}/${u}`,
      );
    fs.writeFileSync(log, '');
    run('sh', [path.join(control, 'prerm'), 'remove'], env);
    run('sh', [path.join(control, 'postrm'), 'remove'], env);
    run('sh', [path.join(control, 'postrm'), 'purge'], env);
    expect(fs.readFileSync(log, 'utf8')).toContain('deb-systemd-helper purge qemu-vmsr-helper.socket vmsr-helper-exporter.service');
    for (const u of QEMU_UNITS)
      expect(fs.readFileSync(log, 'utf8')).toContain(`dpkg-divert --package vmsr-helper --rename --remove /${UNIT_DIR}/${u}`);
  });
  test('reinstalled after the administrator disabled the exporter, it stays disabled and the socket stays enabled', (ctx) => {
    if (why) return ctx.skip(why);
    const noCtl = missing({ command: 'systemctl' });
    if (noCtl) return ctx.skip(noCtl);
    run('systemctl', [`--root=${root}`, 'disable', 'vmsr-helper-exporter.service']);
    const exporterLink = path.join(root, 'etc/systemd/system/multi-user.target.wants/vmsr-helper-exporter.service');
    expect(isLink(exporterLink)).toBe(false);
    dpkg(['-i', deb]);
    expect(dpkg(['-s', 'vmsr-helper'])).toMatch(/^Status: install ok installed$/m);
    expect(isLink(exporterLink)).toBe(false);
    expect(isLink(path.join(root, 'etc/systemd/system/sockets.target.wants/qemu-vmsr-helper.socket'))).toBe(true);
  });

  test('removed, its units go and its default file stays; purged, the default file and the enablement state go; the group stays', (ctx) => {
    if (why) return ctx.skip(why);
    dpkg(['-r', 'vmsr-helper']);
    expect(dpkg(['-s', 'vmsr-helper'])).toMatch(/^Status: deinstall ok config-files$/m);
    // Ours are gone, and QEMU's own units are back where qemu-system-common put them.
    expect(fs.existsSync(path.join(root, UNIT_DIR, 'vmsr-helper-exporter.service'))).toBe(false);
    for (const u of QEMU_UNITS) expect(fs.readFileSync(path.join(root, UNIT_DIR, u), 'utf8'), u).toBe(QEMU_UNIT_TEXT);
    expect(run('dpkg-divert', [`--root=${root}`, '--list', 'vmsr-helper'])).toBe('');
    expect(isLink(path.join(root, 'usr/bin/vmsr-helper'))).toBe(false);
    expect(fs.existsSync(path.join(root, 'etc/default/vmsr-helper'))).toBe(true);
    dpkg(['-P', 'vmsr-helper']);
    expect(() => dpkg(['-s', 'vmsr-helper'])).toThrow();
    expect(fs.existsSync(path.join(root, 'etc/default/vmsr-helper'))).toBe(false);
    expect(fs.existsSync(path.join(root, 'var/lib/systemd/deb-systemd-helper-enabled/sockets.target.wants/qemu-vmsr-helper.socket'))).toBe(
      false,
    );
    expect(isLink(path.join(root, 'etc/systemd/system/sockets.target.wants/qemu-vmsr-helper.socket'))).toBe(false);
    expect(fs.readFileSync(path.join(root, 'etc/group'), 'utf8')).toMatch(/^vmsr-observers:/m);
    expect(hostState()).toEqual(before);
  });
});
