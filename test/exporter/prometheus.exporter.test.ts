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
import { startChild } from '../v2/harness.js';
import { MovingHost, startDaemon, startExporterChild, startPrometheus } from './support/stack.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function later<T extends { stop(): unknown } | { kill(): unknown } | { close(): unknown } | { cleanup(): unknown }>(x: T): T {
  cleanups.push(() => ('stop' in x ? x.stop() : 'kill' in x ? x.kill() : 'close' in x ? x.close() : x.cleanup()));
  return x;
}

async function setup() {
  const h = later(new MovingHost());
  h.pump(50);
  const dir = tempDir('vmsr-exporter-');
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  const sock = path.join(dir, 'helper.sock');
  return { h, sock, daemon: later(await startDaemon(h, sock)) };
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

const energyOf = (m: Map<string, number>, pid: number) => m.get(`vmsr_vm_energy_joules_total{name="",uuid="",pid="${pid}",vpkg="0"}`);

/** Polls an async check until it returns a value (not undefined), or fails naming `what` with `log()`. */
async function poll<T>(check: () => Promise<T | undefined>, what: string, log: () => string, ms = 30_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}\n${log()}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe('exporter with the daemon and Prometheus', () => {
  test('Prometheus answers rate() of every VM energy, busy above idle, and promtool accepts the exposition', async (ctx) => {
    const why = missing({ command: 'prometheus' }) ?? missing({ command: 'promtool' });
    if (why) return ctx.skip(`${why} (apt-get install prometheus; .ci/run does)`);
    const { sock, daemon } = await setup();
    const busy = later(startChild('spin'));
    const idle = later(startChild('sleep'));
    await registerVms(sock, [busy.pid, idle.pid]);
    const exporter = later(await startExporterChild(sock));
    const prom = later(await startPrometheus(new URL(exporter.url).host));
    const logs = () => `--- prometheus:\n${prom.log()}\n--- exporter:\n${exporter.stderr()}\n--- daemon:\n${daemon.stderr()}`;

    const rates = await poll(
      async () => {
        const r = await prom.query('rate(vmsr_vm_energy_joules_total[5s])');
        return r.length === 2 && r.every((x) => Number(x.value[1]) > 0 || x.metric.pid === String(idle.pid)) ? r : undefined;
      },
      'a rate for both VMs',
      logs,
      40_000,
    );
    const byPid = new Map(rates.map((r) => [r.metric.pid, Number(r.value[1])]));
    expect([...byPid.keys()].sort()).toEqual([String(busy.pid), String(idle.pid)].sort());
    // The busy VM's thread runs all the time: it gets most of the 50 W; the sleeper next to nothing.
    expect(byPid.get(String(busy.pid))!).toBeGreaterThan(1);
    expect(byPid.get(String(busy.pid))!).toBeGreaterThan(byPid.get(String(idle.pid))! * 5);
    // Watts over an interval, as Prometheus sees them, and the VMs' info series.
    const watts = await prom.query(`vmsr_vm_power_watts{pid="${busy.pid}"}`);
    expect(Number(watts[0]?.value[1])).toBeGreaterThan(1);
    const info = await prom.query('vmsr_vm_info');
    expect(info.map((i) => [i.metric.pid, i.metric.source]).sort()).toEqual(
      [
        [String(busy.pid), 'registered'],
        [String(idle.pid), 'registered'],
      ].sort(),
    );
    // The target is healthy in Prometheus's own view.
    const up = await prom.query('up{job="vmsr"}');
    expect(up[0]?.value[1]).toBe('1');

    // promtool lints the live exposition.
    const body = await (await fetch(exporter.url)).text();
    const out = execFileSync('sh', ['-c', 'promtool check metrics 2>&1; echo "rc=$?"'], { input: body, encoding: 'utf8' });
    expect(out.trim()).toBe('rc=0');

    // Totals balance: every VM's energy plus the unattributed energy is the packages' energy (up to a
    // sample in flight between the VM and host updates: one 0.25 s interval at 50 W = 12.5 J).
    const m = parseExposition(body);
    const vmSum = [...m].filter(([k]) => k.startsWith('vmsr_vm_energy_joules_total{')).reduce((a, [, v]) => a + v, 0);
    const pkgSum = [...m].filter(([k]) => k.startsWith('vmsr_host_package_energy_joules_total{')).reduce((a, [, v]) => a + v, 0);
    const unattributed = m.get('vmsr_unattributed_energy_joules_total')!;
    expect(pkgSum).toBeGreaterThan(20);
    expect(Math.abs(vmSum + unattributed - pkgSum)).toBeLessThan(13);
  });

  test('counters never go backwards and keep growing when the daemon restarts under the exporter', async () => {
    const { h, sock, daemon } = await setup();
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
    await poll(async () => ((await record()) ?? 0) > 5 ? true : undefined, 'energy before the restart', logs);
    const before = seen.at(-1)!;

    await daemon.stop();
    await reg.close();
    for (let i = 0; i < 5; i++) await record(); // while the daemon is away: the series stays, unchanged
    const again = later(await startDaemon(h, sock));
    reg = await registerVms(sock, [busy.pid]);
    await poll(async () => ((await record()) ?? 0) > before + 5 ? true : undefined, 'energy to grow after the restart', () => `${logs()}\n--- daemon:\n${again.stderr()}`);

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
    await poll(async () => (energyOf(await scrape(exporter.url), b.pid) !== undefined ? true : undefined), 'both VMs exported', () => exporter.stderr());
    await b.kill();
    // Several 0.25 s intervals: the daemon has seen the process go and sent its last UPDATE.
    await new Promise((r) => setTimeout(r, 1500));
    const first = await scrape(exporter.url);
    const second = await scrape(exporter.url);
    expect(energyOf(first, b.pid)).toBeDefined();
    expect(energyOf(second, b.pid)).toBeUndefined();
    expect(energyOf(second, a.pid)).toBeDefined();
  });
});
