/**
 * `vmsr-helper demo` for real: the built binary starts the daemon on synthetic energy, the exporter
 * and the demo VM; a scrape shows the VM found by discovery and the synthetic marker; SIGTERM stops
 * all three and leaves nothing behind. And the fake MSR tree recipe of docs/try-it.md, run as it is
 * written, is one the daemon starts on.
 */
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { DEMO_VM, selfCommand } from '../../src/cli/commands/demo.js';
import { BIN, ROOT, spawnHelper, tempDir, waitFor } from '../daemon/support/daemon-process.js';
import { pollFor } from '../support/wait.js';
import { V2Client } from '../../src/client/v2-client.js';
import { StatsReader } from '../../src/client/stats-reader.js';

/** A folder whose `vmsr-helper` is the built script, for doc lines written as installed. */
function shim(dir: string): string {
  const bin = path.join(dir, 'bin');
  fs.mkdirSync(bin, { recursive: true });
  if (!fs.existsSync(path.join(bin, 'vmsr-helper'))) fs.symlinkSync(BIN, path.join(bin, 'vmsr-helper'));
  return bin;
}

/** The built demo VM, which demo.ts starts for the demo. */
const DEMO_VM_SCRIPT = path.join(ROOT, 'dist/src/cli/demo/demo-vm.js');

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe('the commands the demo prints', () => {
  test('selfCommand says vmsr-helper where that name on PATH runs the script, else node and its path (relative in a clone only), never through npx or npm run', () => {
    const dir = fs.realpathSync(tempDir('vmsr-self-'));
    try {
      const script = path.join(dir, 'clone/dist/src/bin/vmsr-helper.js');
      fs.mkdirSync(path.dirname(script), { recursive: true });
      fs.writeFileSync(script, '');
      const bin = path.join(dir, 'bin');
      const npx = path.join(dir, '.npm/_npx/abc/node_modules/.bin');
      for (const d of [bin, npx]) fs.mkdirSync(d, { recursive: true });
      fs.symlinkSync(script, path.join(npx, 'vmsr-helper'));
      const node = (p: string) => new RegExp(`^(node|${process.execPath.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}) ${p}$`);
      // In the clone's root, with npx's folder on PATH (another terminal has none): node and the relative path.
      expect(selfCommand(script, path.join(dir, 'clone'), `${npx}:/usr/bin:/bin`)).toMatch(node('dist/src/bin/vmsr-helper.js'));
      // Outside the clone: the absolute path.
      expect(selfCommand(script, bin, `${npx}:/usr/bin:/bin`)).toMatch(node(script));
      // Installed into a project (npm install ./vmsr-helper-*.tgz, run with npx from the project): the absolute path too.
      const installed = path.join(dir, 'project/node_modules/vmsr-helper/dist/src/bin/vmsr-helper.js');
      fs.mkdirSync(path.dirname(installed), { recursive: true });
      fs.writeFileSync(installed, '');
      expect(selfCommand(installed, path.join(dir, 'project'), '/usr/bin:/bin')).toMatch(node(installed));
      // Installed: vmsr-helper on PATH is this very script.
      fs.symlinkSync(script, path.join(bin, 'vmsr-helper'));
      expect(selfCommand(path.join(bin, 'vmsr-helper'), bin, `${bin}:/usr/bin`)).toBe('vmsr-helper');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('vmsr-helper demo', () => {
  test('demo serves a discovered demo VM on synthetic energy, says so everywhere, and stops cleanly on SIGTERM', async () => {
    const before = new Set(fs.readdirSync('/tmp').filter((f) => f.startsWith('vmsr-demo-')));
    const demo = spawnHelper(['demo', '--listen', '127.0.0.1:0']);
    try {
      // Generous: the machine is shared; start-up (three Node processes) takes 2 to 5 s when idle.
      await waitFor(() => /Ctrl-C/.test(demo.stderr()), 'the banner', demo, 60_000);
      const out = demo.stderr();
      const url = /exporter {2}(http:\/\/127\.0\.0\.1:\d+\/metrics)/.exec(out)![1]!;
      const socket = /socket (\/\S+\/vmsr\.sock)/.exec(out)![1]!;
      const dir = path.dirname(socket);
      expect(fs.existsSync(socket)).toBe(true);
      const pids = [...out.matchAll(/pid (\d+)/g)].map((m) => Number(m[1]));
      // The energy is called synthetic by the demo itself and by the daemon's warning (the exporter: below).
      expect(out).toMatch(/vmsr-helper demo: the energy is SYNTHETIC/);
      expect(out).toMatch(/\[daemon\] .* WARN {2}\[v2\] energy counters SYNTHESISED/);
      // Discovery finds the demo VM (within two intervals) and the exporter serves it with the marker.
      const body = await pollFor(
        async () => {
          const text = await (await fetch(url)).text();
          return /^vmsr_vm_power_watts\{name="demo-vm".*vpkg="1",domain="package"\} /m.test(text) ? text : undefined;
        },
        'the demo VM in a scrape',
        () => demo.stderr(),
        60_000,
      );
      expect(body).toMatch(/^vmsr_energy_source_info\{source="synthetic"\} 1$/m);
      expect(body).toMatch(
        new RegExp(
          `^vmsr_vm_info\\{name="${DEMO_VM.name}",uuid="${DEMO_VM.uuid}",pid="\\d+",uid="\\d+",source="discovered",whole_vm_only="0",sampled_whole="1"\\} 1$`,
          'm',
        ),
      );
      expect(body).toMatch(/^vmsr_host_package_energy_joules_total\{package="0",domain="package"\} \d/m);
      // The printed commands, run as printed by a shell in the demo's working directory: they say synthetic too
      // (the host file's energy_source). In a clone they start with `node dist/src/bin/vmsr-helper.js`.
      const printed = (verb: string) => new RegExp(`^ {2}(\\S.* ${verb} -k ${socket}.*)$`, 'm').exec(out)![1]!;
      const run = (line: string) => execFileSync('sh', ['-c', line], { encoding: 'utf8', timeout: 30_000, cwd: ROOT });
      expect(printed('stats')).toMatch(/^(vmsr-helper|node \S+vmsr-helper\.js|\/\S+ \S+vmsr-helper\.js) stats/);
      const table = run(`${printed('watch')} --count 1`);
      expect(table).toMatch(/^energy: SYNTHETIC \(the helper runs with --energy-source synthetic\): not a measurement$/m);
      const once = run(`${printed('stats')} --once`);
      expect(once.split('\n')[0]).toBe('energy: SYNTHETIC (the helper runs with --energy-source synthetic): not a measurement');
      expect(once).toMatch(/demo-vm/);
      const json = run(`${printed('watch')} --count 1 --json`);
      // Discovery sees every QEMU on the host (another test's may run meanwhile): the demo VM's line, wherever it is.
      const demoLine = (text: string) =>
        text
          .split('\n')
          .filter((l) => l.startsWith('{'))
          .map((l) => JSON.parse(l) as Record<string, unknown>)
          .find((o) => o.name === DEMO_VM.name);
      expect(demoLine(json)).toMatchObject({ type: 'vm', name: 'demo-vm', energy_source: 'synthetic' });
      const statsJson = run(`${printed('stats')} --once --json`);
      expect(demoLine(statsJson)).toMatchObject({ type: 'vm', name: 'demo-vm', energy_source: 'synthetic' });
      // Each --json output starts with the daemon's record: its socket, its source, its domains.
      for (const text of [json, statsJson])
        expect(JSON.parse(text.split('\n')[0]!)).toEqual({ type: 'daemon', socket, energy_source: 'synthetic', domains: ['package'] });
      // docs/try-it.md's record block, as printed with this demo's socket: record --vm takes the source the daemon states.
      const doc = fs.readFileSync(path.join(ROOT, 'docs/try-it.md'), 'utf8');
      const recordBlock = /```sh\n(vmsr-helper record --vm [\s\S]*?)```/
        .exec(doc)![1]!
        .replaceAll('/tmp/vmsr-demo-XXXXXX', path.dirname(socket));
      const work = tempDir('vmsr-demo-record-');
      // Another demo's VM on the host (same name, same UUID): the printed block still names this demo's.
      const neighbour = spawn(process.execPath, [DEMO_VM_SCRIPT, '-name', DEMO_VM.name, '-uuid', DEMO_VM.uuid, '-smp', '1'], {
        stdio: ['ignore', 'pipe', 'ignore'],
      });
      try {
        let out = '';
        neighbour.stdout.on('data', (b: Buffer) => (out += b.toString()));
        await pollFor(
          async () => (out.startsWith('ready') ? true : undefined),
          'the neighbour demo VM to name its threads',
          () => out,
        );
        const recorded = execFileSync('sh', ['-ec', recordBlock], {
          cwd: work,
          encoding: 'utf8',
          timeout: 60_000,
          env: { ...process.env, PATH: `${shim(work)}:${process.env.PATH}` },
        });
        expect(recorded).toMatch(/^demo-vm .* running /m);
        expect(recorded).toMatch(/synthe/i);
      } finally {
        neighbour.kill('SIGKILL');
        fs.rmSync(work, { recursive: true, force: true });
      }
      expect(await demo.stop('SIGTERM')).toBe(0);
      expect(demo.stderr()).toMatch(/vmsr-helper demo: stopping \(SIGTERM received\)/);
      // No leftovers: its directory is gone, and so are the daemon, the VM and the exporter.
      expect(fs.existsSync(dir)).toBe(false);
      expect(pids.length).toBeGreaterThanOrEqual(2);
      for (const pid of pids) expect(alive(pid), `pid ${pid}`).toBe(false);
      const after = fs.readdirSync('/tmp').filter((f) => f.startsWith('vmsr-demo-') && !before.has(f));
      expect(after).toEqual([]);
    } finally {
      await demo.stop('SIGTERM');
    }
  }, 120_000);

  test('demo --no-vm --duration stops by itself, exit status 0, and removes its directory', async () => {
    const demo = spawnHelper(['demo', '--no-vm', '--duration', '3', '--listen', '127.0.0.1:0']);
    try {
      // 3 s after start-up, plus start-up itself on a loaded machine: generous.
      const code = await Promise.race([demo.exited, new Promise((r) => setTimeout(() => r('still running after 60 s'), 60_000))]);
      expect(code, demo.stderr()).toBe(0);
      const out = demo.stderr();
      expect(out).toContain('no demo VM (--no-vm)');
      expect(out).toMatch(/vmsr-helper demo: stopping \(--duration 3 s elapsed\)/);
      const dir = path.dirname(/socket (\/\S+\/vmsr\.sock)/.exec(out)![1]!);
      expect(fs.existsSync(dir)).toBe(false);
    } finally {
      await demo.stop('SIGTERM');
    }
  }, 90_000);

  test('demo stops everything with exit status 1 naming the exporter when its port is taken', async () => {
    const taken = net.createServer();
    await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
    const port = (taken.address() as net.AddressInfo).port;
    const demo = spawnHelper(['demo', '--no-vm', '--listen', `127.0.0.1:${port}`]);
    try {
      const code = await Promise.race([demo.exited, new Promise((r) => setTimeout(() => r('still running after 60 s'), 60_000))]);
      expect(code, demo.stderr()).toBe(1);
      expect(demo.stderr()).toMatch(
        /vmsr-helper demo: cannot start the demo's exporter: it ended \(exit code \d+\) before its HTTP port; see its lines above/,
      );
      expect(demo.stderr()).toMatch(/\[exporter\] .*EADDRINUSE|\[exporter\] .*in use/);
      const dir = path.dirname(/Listening on (\/\S+\/vmsr\.sock)/.exec(demo.stderr())![1]!);
      expect(fs.existsSync(dir)).toBe(false);
    } finally {
      await demo.stop('SIGTERM');
      taken.close();
    }
  }, 90_000);

  test('demo refuses a bad --listen before starting anything', () => {
    let err = '';
    try {
      execFileSync(process.execPath, [BIN, 'demo', '--listen', 'nowhere'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    } catch (e) {
      err = (e as { stderr: string }).stderr;
    }
    expect(err).toMatch(/--listen/);
    expect(err).not.toMatch(/SYNTHETIC/);
  });

  test('the fake MSR tree recipe of docs/try-it.md, run as printed, gives the right energy in every domain the daemon turns on', async () => {
    const doc = fs.readFileSync(path.join(ROOT, 'docs/try-it.md'), 'utf8');
    const section = doc.slice(doc.indexOf('## A fake MSR tree'));
    const [tree, flow] = [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
    const lines = tree!.trimEnd().split('\n');
    const start = lines.pop()!;
    expect(start).toBe(
      'vmsr-helper --msr-path "$D/dev/cpu/%u/msr" --sys-root $D/sys --vendor intel -k /tmp/vmsr-fake.sock -f /tmp/vmsr-fake.pid',
    );
    const dir = tempDir();
    try {
      execFileSync('sh', ['-ec', lines.join('\n')], { cwd: dir });
      const D = path.join(dir, 'fake');
      // The daemon as printed, with this test's own socket and pid file.
      const args = [
        '--msr-path',
        `${D}/dev/cpu/%u/msr`,
        '--sys-root',
        `${D}/sys`,
        '--vendor',
        'intel',
        '-k',
        `${dir}/s.sock`,
        '-f',
        `${dir}/pid`,
      ];
      const child = spawnHelper(args);
      try {
        await waitFor(() => /Listening on/.test(child.stderr()), 'the daemon listening', child, 30_000);
        // Every domain it turns on is one the recipe wrote: the package and the core, nothing read from another's bytes.
        expect(child.stderr()).toMatch(
          /energy counters read from RAPL MSRs: package 0x611 \(61\.04 µJ\), core 0x639 \(61\.04 µJ\); not read: uncore: MSR 0x641 reads 0 on package 0 \(not counting\), dram: [^,]*, psys: MSR 0x64d reads 0 on package 0 \(not counting\)"/,
        );
        // The next block as printed (its own socket): the core 8 J since the start, the package 16 J.
        const printed = flow!.replaceAll('/tmp/vmsr-fake.sock', `${dir}/s.sock`);
        expect(printed).not.toBe(flow);
        const host = async () => {
          const c = await V2Client.connect(`${dir}/s.sock`);
          try {
            const r = StatsReader.open((await c.statsFd(0)).fd);
            const s = r.read();
            const out = {
              samples: Number(r.value(s, 'samples')),
              pkg: Number(r.values(s, 'package_energy')![0]),
              core: Number(r.values(s, 'core_energy')![0]),
            };
            r.close();
            return out;
          } finally {
            await c.close();
          }
        };
        // Written after the daemon's first sample, its baseline (a user types it in another terminal).
        await pollFor(
          async () => ((await host()).samples > 0 ? true : undefined),
          "the daemon's first sample",
          () => child.stderr(),
          30_000,
        );
        // The daemon samples once a second: the block sleeps 2 s; a loaded machine may take longer.
        let out = '';
        await pollFor(
          async () => {
            out = execFileSync('sh', ['-ec', printed], {
              cwd: dir,
              encoding: 'utf8',
              env: { ...process.env, PATH: `${shim(dir)}:${process.env.PATH}` },
            });
            const h = await host();
            return h.pkg === 16_000_000 && h.core === 8_000_000 ? h : undefined;
          },
          'the package at 16 J and the core at 8 J in the host statistics file',
          () => child.stderr() + out,
          60_000,
        );
        expect(out).toMatch(/^\s+0 {2}core\s+\S+\s+8\.000\s/m);
        expect(out).not.toMatch(/4096/);
        expect(await child.stop('SIGTERM')).toBe(0);
      } finally {
        await child.stop('SIGKILL');
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }, 150_000);
});
