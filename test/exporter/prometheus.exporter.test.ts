/**
 * The exporter with real parts: the helper daemon as a child (FakeHost MSR files whose energy moves),
 * real processes as VMs, `vmsr-helper exporter` as a child, and the Debian prometheus server scraping
 * it. Prometheus answers rate() per VM; promtool accepts the exposition; counters never go backwards
 * across a daemon restart; an ended VM is scraped once more, then gone.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { missing } from '../support/env.js';
import { tempDir } from '../daemon/support/daemon-process.js';
import { pollFor } from '../support/wait.js';
import { pinnedChildMissing, startChild, startPinnedChild } from '../v2/harness.js';
import { qemuMissing, startQemu } from '../support/qemu.js';
import { MovingHost, readmeQueries, startDaemon, startExporterChild, startPrometheus } from './support/stack.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function later<T extends { stop(): unknown } | { kill(): unknown } | { close(): unknown } | { cleanup(): unknown }>(x: T): T {
  cleanups.push(() => ('stop' in x ? x.stop() : 'kill' in x ? x.kill() : 'close' in x ? x.close() : x.cleanup()));
  return x;
}

/**
 * The daemon on a moving fake host. Without `discover`, only the test's registered VMs exist (this
 * machine runs other QEMUs that discovery would find, and their comings and goings).
 */
async function setup(o: { discover?: boolean; extra?: string[]; packages?: number[] } = {}) {
  const h = later(new MovingHost(o.packages));
  for (const pkg of new Set(o.packages ?? [0])) h.pump(50 - 20 * pkg, pkg);
  const dir = tempDir('vmsr-exporter-');
  fs.chmodSync(dir, 0o755); // an unprivileged exporter must reach the socket
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  const sock = path.join(dir, 'helper.sock');
  const args = [...(o.discover ? [] : ['--no-discovery']), ...(o.extra ?? [])];
  return { h, sock, args, daemon: later(await startDaemon(h, sock, args)) };
}

/** Registers processes as one-vCPU VMs (their main thread) on one connection that stays open. */
async function registerVms(sock: string, pids: number[]): Promise<V2Client> {
  const c = later(await V2Client.connect(sock));
  for (const pid of pids) await c.register({ pid, vcpus: [{ tid: pid, vpkg: 0 }] });
  return c;
}

/** Parses the Prometheus text format: series (name + labels as written) -> value. */
function parseExposition(body: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of body.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return out;
}

async function scrape(url: string): Promise<Map<string, number>> {
  return parseExposition(await (await fetch(url)).text());
}

/** The uid owning the VMs this file starts (its own children). */
const UID = process.getuid!();
const energyOf = (m: Map<string, number>, pid: number) =>
  m.get(`vmsr_vm_energy_joules_total{name="",uuid="",pid="${pid}",uid="${UID}",vpkg="0",domain="package"}`);

describe('exporter with the daemon and Prometheus', () => {
  test('Prometheus answers rate() per discovered QEMU VM, busy far above idle, with no per-VM command; the README queries answer', async (ctx) => {
    const why = missing({ command: 'prometheus' }) ?? qemuMissing();
    if (why) return ctx.skip(`${why} (.ci/run installs prometheus and QEMU)`);
    const { sock, daemon } = await setup({ discover: true });
    const tag = `${process.pid}-${Date.now() % 100000}`;
    const busy = later(await startQemu({ mode: 'a', smp: 2, sockets: 2, name: `exp-busy-${tag}` }));
    const idle = later(await startQemu({ mode: 'i', smp: 2, sockets: 2, name: `exp-idle-${tag}` }));
    const exporter = later(await startExporterChild(sock));
    const prom = later(await startPrometheus(new URL(exporter.url).host));
    const logs = () => `--- prometheus:\n${prom.log()}\n--- exporter:\n${exporter.stderr()}\n--- daemon:\n${daemon.stderr()}`;
    const ours = `name=~"exp-(busy|idle)-${tag}"`;

    // Other QEMUs on this machine are discovered too; ours are picked out by the names QEMU was given.
    // The idle guest's boot shows in the first seconds: wait for a window of steady state.
    const rates = await pollFor(
      async () => {
        const r = await prom.query(`sum by (name) (rate(vmsr_vm_energy_joules_total{${ours}}[5s]))`);
        const w = new Map(r.map((x) => [x.metric.name, Number(x.value[1])]));
        return r.length === 2 && w.get(busy.name)! > 0.5 && w.get(busy.name)! > 5 * w.get(idle.name)! ? w : undefined;
      },
      'both QEMU VMs in Prometheus, the busy one drawing over 5x the idle one',
      logs,
      50_000,
    );
    expect(rates.get(busy.name)!).toBeGreaterThan(5 * rates.get(idle.name)!);
    // Two virtual packages each (-smp 2,sockets=2), found from the command line; discovered, not registered.
    const vpkgs = await prom.query(`count by (name) (vmsr_vm_energy_joules_total{${ours}})`);
    expect(vpkgs.map((r) => [r.metric.name, r.value[1]]).sort()).toEqual(
      [
        [busy.name, '2'],
        [idle.name, '2'],
      ].sort(),
    );
    const info = await prom.query(`vmsr_vm_info{${ours}}`);
    expect(info.map((i) => [i.metric.name, i.metric.pid, i.metric.source]).sort()).toEqual(
      [
        [busy.name, String(busy.pid), 'discovered'],
        [idle.name, String(idle.pid), 'discovered'],
      ].sort(),
    );
    expect((await prom.query('up{job="vmsr"}'))[0]?.value[1]).toBe('1');

    // The README's three queries, exactly as printed, each answer with values.
    const queries = readmeQueries();
    expect(queries).toHaveLength(3);
    const [perVm, top10, unattributedShare] = await Promise.all(queries.map((q) => prom.query(q)));
    expect(perVm!.find((r) => r.metric.name === busy.name)).toBeDefined();
    expect(Number(perVm!.find((r) => r.metric.name === busy.name)!.value[1])).toBeGreaterThan(0.5);
    expect(top10!.length).toBeGreaterThan(0);
    expect(top10!.length).toBeLessThanOrEqual(10);
    expect(unattributedShare).toHaveLength(1); // one value per package: this host has package 0 only
    expect(unattributedShare![0]!.metric.package).toBe('0');
    const share = Number(unattributedShare![0]!.value[1]);
    expect(share).toBeGreaterThanOrEqual(0);
    expect(share).toBeLessThanOrEqual(1);
  });

  test('registered VMs are exported with their energy and info, promtool accepts the live exposition, and totals balance', async (ctx) => {
    const why = missing({ command: 'promtool' });
    if (why) return ctx.skip(`${why} (apt-get install prometheus; .ci/run does)`);
    const { sock } = await setup();
    const busy = later(startChild('spin'));
    const idle = later(startChild('sleep'));
    await registerVms(sock, [busy.pid, idle.pid]);
    const exporter = later(await startExporterChild(sock));
    const body = await pollFor(
      async () => {
        const b = await (await fetch(exporter.url)).text();
        const x = parseExposition(b);
        const power = x.get(`vmsr_vm_power_watts{name="",uuid="",pid="${busy.pid}",uid="${UID}",vpkg="0",domain="package"}`);
        return (energyOf(x, busy.pid) ?? 0) > 5 && energyOf(x, idle.pid) !== undefined && power !== undefined ? b : undefined;
      },
      'both VMs exported, the busy one with energy and power',
      () => exporter.stderr(),
    );
    const m = parseExposition(body);
    expect(energyOf(m, busy.pid)!).toBeGreaterThan(5 * energyOf(m, idle.pid)!);
    expect(
      m.get(`vmsr_vm_info{name="",uuid="",pid="${busy.pid}",uid="${UID}",source="registered",whole_vm_only="0",sampled_whole="1"}`),
    ).toBe(1);
    expect(m.get(`vmsr_vm_power_watts{name="",uuid="",pid="${busy.pid}",uid="${UID}",vpkg="0",domain="package"}`)).toBeGreaterThan(1);

    const out = execFileSync('sh', ['-c', 'promtool check metrics 2>&1; echo "rc=$?"'], { input: body, encoding: 'utf8' });
    expect(out.trim()).toBe('rc=0');

    // Totals balance: every VM's energy plus the unattributed energy is the packages' energy (up to a
    // sample in flight between the VM and host updates: one 0.25 s interval at 50 W = 12.5 J).
    const sum = (prefix: string) => [...m].filter(([k]) => k.startsWith(prefix)).reduce((a, [, v]) => a + v, 0);
    const vmSum = sum('vmsr_vm_energy_joules_total{');
    const pkgSum = sum('vmsr_host_package_energy_joules_total{');
    const unattributed = m.get('vmsr_unattributed_energy_joules_total{domain="package"}')!;
    expect(pkgSum).toBeGreaterThan(5);
    expect(Math.abs(vmSum + unattributed - pkgSum), body).toBeLessThan(13);
  });

  test('per host package, the exported energy is that of the VMs that ran on it plus its unattributed energy, and no counter goes backwards', async (ctx) => {
    const why = pinnedChildMissing(1);
    if (why) return ctx.skip(why);
    // CPU 0 is package 0 and CPU 1 package 1; one VM bound to each CPU, so per package the VMs'
    // share is that one VM's energy.
    const { h, sock } = await setup({ packages: [0, 1] });
    const vms = [later(startPinnedChild(0, 40)), later(startPinnedChild(1, 20))];
    await registerVms(
      sock,
      vms.map((v) => v.pid),
    );
    const exporter = later(await startExporterChild(sock));
    const pkgEnergy = (m: Map<string, number>, pkg: number) =>
      m.get(`vmsr_host_package_energy_joules_total{package="${pkg}",domain="package"}`);
    const pkgUnattributed = (m: Map<string, number>, pkg: number) =>
      m.get(`vmsr_host_package_unattributed_energy_joules_total{package="${pkg}",domain="package"}`);
    const scrapes: Map<string, number>[] = [];
    await pollFor(
      async () => {
        const m = await scrape(exporter.url);
        scrapes.push(m);
        return scrapes.length >= 12 && vms.every((v, pkg) => (energyOf(m, v.pid) ?? 0) > 0.2 && (pkgUnattributed(m, pkg) ?? 0) > 0.2)
          ? true
          : undefined;
      },
      'energy for both VMs and unattributed energy on both packages, over 12 scrapes',
      () => exporter.stderr(),
      20_000,
    );
    // Every counter series, scrape after scrape, never goes back.
    for (let i = 1; i < scrapes.length; i++) {
      for (const [series, v] of scrapes[i]!) {
        if (!series.split('{')[0]!.endsWith('_total')) continue;
        const before = scrapes[i - 1]!.get(series);
        if (before !== undefined) expect(v, series).toBeGreaterThanOrEqual(before);
      }
    }
    // With the packages still, nothing moves after the next sample: a scrape then sees one sample's
    // VM and host values together, and per package they balance to the microjoule.
    h.stopPumps();
    const still = await pollFor(
      async () => {
        const a = await scrape(exporter.url);
        await new Promise((r) => setTimeout(r, 700)); // more than two 0.25 s intervals
        const b = await scrape(exporter.url);
        return [0, 1].every((pkg) => pkgEnergy(a, pkg) === pkgEnergy(b, pkg)) && vms.every((v) => energyOf(a, v.pid) === energyOf(b, v.pid))
          ? b
          : undefined;
      },
      'the energy to stand still once the packages stop drawing power',
      () => exporter.stderr(),
      15_000,
    );
    for (const [pkg, vm] of vms.entries()) {
      const total = pkgEnergy(still, pkg)!;
      const parts = energyOf(still, vm.pid)! + pkgUnattributed(still, pkg)!;
      expect(total).toBeGreaterThan(1);
      // Each value is floored to a µJ on its own: three floors apart at most.
      expect(
        Math.abs(total - parts),
        `package ${pkg}: ${total} J = ${energyOf(still, vm.pid)} J (pid ${vm.pid}) + ${pkgUnattributed(still, pkg)} J`,
      ).toBeLessThan(5e-6);
    }
    // The host-wide series is the packages' sum.
    const perPackage = pkgUnattributed(still, 0)! + pkgUnattributed(still, 1)!;
    expect(Math.abs(still.get('vmsr_unattributed_energy_joules_total{domain="package"}')! - perPackage)).toBeLessThan(5e-6);
  });

  test('an exporter running as an unprivileged user in the observer group exports every VM and the host', async (ctx) => {
    const why = missing({ root: true });
    if (why) return ctx.skip(why);
    const nobody = 65534;
    const { sock } = await setup({ extra: ['--observer-group', String(nobody)] });
    // What SocketGroup=/SocketMode=0660 do under systemd.
    fs.chownSync(sock, 0, nobody);
    fs.chmodSync(sock, 0o660);
    const vm = later(startChild('sleep'));
    await registerVms(sock, [vm.pid]); // root's VM: only the observer group lets nobody see it
    const exporter = later(await startExporterChild(sock, [], { uid: nobody, gid: nobody }));
    const m = await pollFor(
      async () => {
        const x = await scrape(exporter.url);
        return energyOf(x, vm.pid) !== undefined && x.has('vmsr_unattributed_energy_joules_total{domain="package"}') ? x : undefined;
      },
      "root's VM and the host energy",
      () => exporter.stderr(),
    );
    expect(m.get('vmsr_exporter_helper_connected')).toBe(1);
    expect(exporter.stderr()).not.toContain('runs as root');
  });

  test('an exporter outside the observer group is told the fix, and exports nothing it may not see', async (ctx) => {
    const why = missing({ root: true });
    if (why) return ctx.skip(why);
    const nobody = 65534;
    const { sock } = await setup();
    fs.chmodSync(sock, 0o666); // it may connect, but it is not an observer
    const vm = later(startChild('sleep'));
    await registerVms(sock, [vm.pid]);
    const exporter = later(await startExporterChild(sock, [], { uid: nobody, gid: nobody }));
    await pollFor(
      async () => (exporter.stderr().includes('--observer-group') ? true : undefined),
      'the refusal to be logged',
      () => exporter.stderr(),
    );
    expect(exporter.stderr()).toMatch(
      /"level":"error".*refuses this exporter: .*start the helper with --observer-group GROUP and add this user to it.*SupplementaryGroups=/,
    );
    const m = await scrape(exporter.url);
    expect(energyOf(m, vm.pid)).toBeUndefined();
    expect(m.has('vmsr_unattributed_energy_joules_total{domain="package"}')).toBe(false);
  });

  test('counters never go backwards and keep growing when the daemon restarts under the exporter', async () => {
    const { h, sock, args, daemon } = await setup();
    void daemon;
    const busy = later(startChild('spin'));
    let reg = await registerVms(sock, [busy.pid]);
    const exporter = later(await startExporterChild(sock));
    const logs = () => `--- exporter:\n${exporter.stderr()}`;
    const seen: number[] = [];
    const record = async () => {
      const v = energyOf(await scrape(exporter.url), busy.pid);
      if (v !== undefined) seen.push(v);
      return v;
    };
    await pollFor(async () => (((await record()) ?? 0) > 5 ? true : undefined), 'energy before the restart', logs);
    const before = seen.at(-1)!;

    await daemon.stop();
    await reg.close();
    for (let i = 0; i < 5; i++) await record(); // while the daemon is away: the series stays, unchanged
    const again = later(await startDaemon(h, sock, args));
    reg = await registerVms(sock, [busy.pid]);
    await pollFor(
      async () => (((await record()) ?? 0) > before + 5 ? true : undefined),
      'energy to grow after the restart',
      () => `${logs()}\n--- daemon:\n${again.stderr()}`,
    );

    for (let i = 1; i < seen.length; i++) expect(seen[i]!).toBeGreaterThanOrEqual(seen[i - 1]!);
    const m = await scrape(exporter.url);
    expect(m.get('vmsr_exporter_helper_connects_total')).toBe(2);
    expect(m.get('vmsr_exporter_helper_connected')).toBe(1);
    expect(exporter.stderr()).toMatch(/lost the helper connection/);
    expect(exporter.stderr()).toMatch(/reconnected to the helper/);
  });

  test('a VM that ends is in the next scrape, then dropped', async () => {
    const { sock } = await setup();
    const a = later(startChild('sleep'));
    const b = later(startChild('sleep'));
    await registerVms(sock, [a.pid, b.pid]);
    const exporter = later(await startExporterChild(sock));
    await pollFor(
      async () => (energyOf(await scrape(exporter.url), b.pid) !== undefined ? true : undefined),
      'both VMs exported',
      () => exporter.stderr(),
    );
    await b.kill();
    // Several 0.25 s intervals: the daemon has seen the process go and sent its last UPDATE.
    await new Promise((r) => setTimeout(r, 1500));
    const first = await scrape(exporter.url);
    const second = await scrape(exporter.url);
    expect(energyOf(first, b.pid)).toBeDefined();
    expect(energyOf(second, b.pid)).toBeUndefined();
    expect(energyOf(second, a.pid)).toBeDefined();
  });

  test('a VM registered after the exporter started is exported within a few intervals', async () => {
    const { sock } = await setup();
    const first = later(startChild('sleep'));
    await registerVms(sock, [first.pid]);
    const exporter = later(await startExporterChild(sock));
    await pollFor(
      async () => (energyOf(await scrape(exporter.url), first.pid) !== undefined ? true : undefined),
      'the first VM',
      () => exporter.stderr(),
    );
    const late = later(startChild('spin'));
    const t0 = Date.now();
    await registerVms(sock, [late.pid]);
    // The host update's "VMs changed" flag makes the exporter LIST again and observe it.
    await pollFor(
      async () => (energyOf(await scrape(exporter.url), late.pid) !== undefined ? true : undefined),
      'the late VM',
      () => exporter.stderr(),
      // The exporter LISTs again only when told VMs changed: without that, never. Far above the ms it takes.
      30_000,
    );
    console.log(`the late VM scraped ${Date.now() - t0} ms after its REGISTER`);
  });

  test('an exporter restart continues from the daemon totals, and SIGTERM stops it cleanly', async () => {
    const { sock } = await setup();
    const busy = later(startChild('spin'));
    await registerVms(sock, [busy.pid]);
    const one = await startExporterChild(sock);
    cleanups.push(() => one.stop('SIGKILL'));
    const before = await pollFor(
      async () => {
        const v = energyOf(await scrape(one.url), busy.pid);
        return v !== undefined && v > 2 ? v : undefined;
      },
      'energy in the first exporter',
      () => one.stderr(),
    );
    expect(await one.stop('SIGTERM')).toBe(0);
    const two = later(await startExporterChild(sock));
    const after = await pollFor(
      async () => energyOf(await scrape(two.url), busy.pid),
      'the VM in the second exporter',
      () => two.stderr(),
    );
    // The daemon ran all along: the new process's first value is the daemon's total, not below the old one.
    expect(after).toBeGreaterThanOrEqual(before);
  });
});
