/**
 * Many hosts, one Prometheus: three "hosts" on distinct loopback addresses (127.0.0.2-4, the same
 * port on each), each with its own daemon on its own moving fake host and its own exporter serving
 * TLS with basic authentication, scraped by one real Prometheus whose job is the shipped
 * contrib/prometheus/vmsr-fleet-scrape.yml with this test's CA, password and targets. Two more
 * jobs scrape the first host with a wrong password and over plain HTTP; an alert rule fires on
 * `up == 0` when a host goes down. A second Prometheus federates the first with the shipped
 * federation.yml; the shipped scrape, federation and remote-write files pass promtool.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { METRIC } from '../../src/exporter/metrics.js';
import { V2Client } from '../../src/client/v2-client.js';
import { startChild } from '../v2/harness.js';
import { missing } from '../support/env.js';
import { ROOT, tempDir, type DaemonChild } from '../daemon/support/daemon-process.js';
import { pollFor } from '../support/wait.js';
import {
  freePort,
  MovingHost,
  startDaemon,
  startExporterChild,
  startPrometheus,
  type ExporterChild,
  type PrometheusServer,
} from './support/stack.js';
import { makeTlsFiles, PASSWORD, PASSWORD_HASH, USER } from './support/tls-files.js';
import { get } from './support/https-get.js';

const CONTRIB = path.join(ROOT, 'contrib/prometheus');
/** Each host's package power, different so that a series landing on the wrong instance shows. */
const WATTS = [20, 40, 60];

const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

interface FleetHost {
  addr: string;
  moving: MovingHost;
  daemon: DaemonChild;
  exporter: ExporterChild;
  target: string;
}

/** The shipped scrape job, pointed at this test's CA, password file and targets. */
function shippedScrapeJob(ca: string, passwordFile: string, targets: string[]): string[] {
  const text = fs.readFileSync(path.join(CONTRIB, 'vmsr-fleet-scrape.yml'), 'utf8');
  const job = text.slice(text.indexOf('scrape_configs:\n') + 'scrape_configs:\n'.length);
  const lines = job
    .replace('/etc/prometheus/vmsr/ca.crt', ca)
    .replace('/etc/prometheus/vmsr/password', passwordFile)
    .split('\n')
    .filter((l) => !/^\s+- hv-\d+\.example\.org:8677$/.test(l));
  const at = lines.findIndex((l) => l.trim() === '- targets:');
  expect(at, 'the shipped job lists its targets under "- targets:"').toBeGreaterThan(0);
  lines.splice(at + 1, 0, ...targets.map((t) => `          - ${t}`));
  return lines.filter((l) => l.trim() !== '');
}

/** The shipped federation job, pointed at `target` over plain HTTP (its TLS and auth lines left out). */
function shippedFederationJob(target: string): string[] {
  const text = fs.readFileSync(path.join(CONTRIB, 'federation.yml'), 'utf8');
  const job = text.slice(text.indexOf('scrape_configs:\n') + 'scrape_configs:\n'.length);
  const lines = job
    .split('\n')
    .filter((l) => !/^\s+(scheme: https|tls_config:|ca_file:|basic_auth:|username:|password_file:)/.test(l))
    .filter((l) => !/^\s+- prometheus\.site-[a-z]\.example\.org:9090$/.test(l));
  const at = lines.findIndex((l) => l.trim() === '- targets:');
  expect(at, 'the shipped federation job lists its targets under "- targets:"').toBeGreaterThan(0);
  lines.splice(at + 1, 0, `          - ${target}`);
  return lines.filter((l) => l.trim() !== '');
}

describe('a fleet of hosts scraped by one Prometheus over TLS with basic auth', () => {
  test('per-host totals are right, a wrong password and plain HTTP are down, and a host going down fires the alert', async (ctx) => {
    const why = missing({ command: 'prometheus' }) ?? missing({ command: 'promtool' });
    if (why) ctx.skip(why);
    const dir = tempDir('vmsr-fleet-');
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
    const files = makeTlsFiles(dir);
    const web = path.join(dir, 'web-config.yml');
    fs.writeFileSync(
      web,
      [
        'tls_server_config:',
        `  cert_file: ${files.serverCert}`,
        `  key_file: ${files.serverKey}`,
        'basic_auth_users:',
        `  ${USER}: ${PASSWORD_HASH}`,
        '',
      ].join('\n'),
    );
    const passwordFile = path.join(dir, 'password');
    fs.writeFileSync(passwordFile, PASSWORD);
    const wrongPasswordFile = path.join(dir, 'wrong-password');
    fs.writeFileSync(wrongPasswordFile, 'not-the-password');

    // The same port on every host, as a fleet has it.
    const port = await freePort();
    const hosts: FleetHost[] = [];
    for (const [i, watts] of WATTS.entries()) {
      const addr = `127.0.0.${i + 2}`;
      const moving = new MovingHost();
      cleanups.push(() => moving.cleanup());
      moving.pump(watts);
      const sock = path.join(dir, `host${i}.sock`);
      const daemon = await startDaemon(moving, sock, ['--no-discovery']);
      cleanups.push(() => daemon.stop());
      // One registered VM (a sleeping process) keeps the helper sampling; without discovery (this
      // machine runs other QEMUs) nothing else would.
      const vm = startChild('sleep');
      cleanups.push(() => vm.kill());
      const client = await V2Client.connect(sock);
      cleanups.push(() => client.close());
      await client.register({ pid: vm.pid, vcpus: [{ tid: vm.pid, vpkg: 0 }] });
      const exporter = await startExporterChild(sock, ['--listen', `${addr}:${port}`, '--web.config.file', web]);
      cleanups.push(() => exporter.stop());
      expect(exporter.url).toBe(`https://${addr}:${port}/metrics`);
      hosts.push({ addr, moving, daemon, exporter, target: `${addr}:${port}` });
    }

    const rules = path.join(dir, 'fleet-alerts.yml');
    fs.writeFileSync(
      rules,
      [
        'groups:',
        '  - name: vmsr-fleet-test',
        '    rules:',
        '      - alert: VmsrExporterDown',
        '        expr: up{job="vmsr"} == 0',
        '        labels: { severity: critical }',
        '        annotations: { summary: "vmsr exporter {{ $labels.instance }} is down" }',
        '',
      ].join('\n'),
    );
    expect(execFileSync('promtool', ['check', 'rules', rules], { encoding: 'utf8' })).toContain('SUCCESS');
    const tlsJob = (name: string, pw: string): string[] => [
      `  - job_name: ${name}`,
      '    scheme: https',
      '    tls_config:',
      `      ca_file: ${files.caCert}`,
      '    basic_auth:',
      `      username: ${USER}`,
      `      password_file: ${pw}`,
      '    static_configs:',
      `      - targets: ['${hosts[0]!.target}']`,
    ];
    const scrapeConfigs = [
      ...shippedScrapeJob(
        files.caCert,
        passwordFile,
        hosts.map((h) => h.target),
      ),
      ...tlsJob('vmsr-wrong-password', wrongPasswordFile),
      '  - job_name: vmsr-plain-http',
      '    static_configs:',
      `      - targets: ['${hosts[0]!.target}']`,
    ];
    const prom: PrometheusServer = await startPrometheus('', { scrapeConfigs, ruleFiles: [rules] });
    cleanups.push(() => prom.stop());
    const logs = () => [prom.log(), ...hosts.map((h) => h.exporter.stderr())].join('\n');

    // Every host up over TLS with the right password; the two bad jobs down.
    const up = await pollFor(
      async () => {
        const r = await prom.query('up');
        const byJob = (job: string) => r.filter((s) => s.metric.job === job).map((s) => `${s.metric.instance}=${s.value[1]}`);
        const ok = byJob('vmsr');
        return ok.length === 3 &&
          ok.every((s) => s.endsWith('=1')) &&
          byJob('vmsr-wrong-password').length === 1 &&
          byJob('vmsr-plain-http').length === 1
          ? { ok, wrong: byJob('vmsr-wrong-password'), plain: byJob('vmsr-plain-http') }
          : undefined;
      },
      'three hosts up and the two bad jobs scraped',
      logs,
      60_000,
    );
    expect(up.ok.sort()).toEqual(hosts.map((h) => `${h.target}=1`));
    expect(up.wrong).toEqual([`${hosts[0]!.target}=0`]);
    expect(up.plain).toEqual([`${hosts[0]!.target}=0`]);
    const targets = (await (await fetch(`${prom.url}/api/v1/targets`)).json()) as {
      data: { activeTargets: { scrapePool: string; lastError: string }[] };
    };
    const lastError = (pool: string) => targets.data.activeTargets.find((t) => t.scrapePool === pool)?.lastError ?? '';
    expect(lastError('vmsr-wrong-password')).toMatch(/401/);
    expect(lastError('vmsr-plain-http')).not.toBe('');

    // The chain moves on every host: each instance's rate is positive and, the fake pump being a
    // timer in this busy test process that may run slow but never fast, not above its host's power.
    const rates = await pollFor(
      async () => {
        const r = await prom.query(`sum by (instance) (rate(${METRIC.packageEnergy}{job="vmsr"}[5s]))`);
        // The first rates may span a scrape from before the helper's first host sample.
        return r.length === 3 && r.every((s) => Number(s.value[1]) > 0)
          ? new Map(r.map((s) => [s.metric.instance!, Number(s.value[1])]))
          : undefined;
      },
      'a rate per host',
      logs,
    );
    for (const [i, h] of hosts.entries()) expect(rates.get(h.target), h.target).toBeLessThan(WATTS[i]! * 1.3);

    // Per-host totals, exactly: with the pumps stopped, Prometheus holds what each host's exporter
    // serves; then each host's package gets a known energy of its own, and each instance grows by it.
    for (const h of hosts) h.moving.stopPumps();
    const stored = async (): Promise<Map<string, number>> =>
      new Map((await prom.query(`${METRIC.packageEnergy}{job="vmsr"}`)).map((s) => [s.metric.instance!, Number(s.value[1])]));
    const before = new Map<string, number>();
    for (const h of hosts) {
      const value = await pollFor(
        async () => {
          const a = await get(h.exporter.url, { ca: files.caCert, auth: `${USER}:${PASSWORD}` });
          await new Promise((r) => setTimeout(r, 1_500));
          const b = await get(h.exporter.url, { ca: files.caCert, auth: `${USER}:${PASSWORD}` });
          const v = (x: typeof a) =>
            'body' in x
              ? new RegExp(`^${METRIC.packageEnergy}\\{package="0",domain="package"\\} (\\S+)$`, 'm').exec(x.body)?.[1]
              : undefined;
          return v(a) !== undefined && v(a) === v(b) ? Number(v(a)) : undefined;
        },
        `${h.target}'s counter to stand still`,
        logs,
      );
      before.set(h.target, value);
    }
    await pollFor(
      async () => {
        const now = await stored();
        return hosts.every((h) => now.get(h.target) === before.get(h.target)) ? true : undefined;
      },
      'Prometheus to hold each host exporter value',
      logs,
    );
    // 2, 4 and 6 J in ten steps of 100 ms (ESU 14: 2^14 units a joule): 2 to 6 W, a plausible power.
    const added = WATTS.map((w) => w / 10);
    for (let step = 0; step < 10; step++) {
      for (const [i, h] of hosts.entries()) h.moving.host.addEnergy(0, (added[i]! * 2 ** 14) / 10);
      await new Promise((r) => setTimeout(r, 100));
    }
    await pollFor(
      async () => {
        const now = await stored();
        return hosts.every((h, i) => Math.abs(now.get(h.target)! - before.get(h.target)! - added[i]!) < 1e-3) ? true : undefined;
      },
      'each instance to grow by its own host energy',
      () => `${JSON.stringify([...before])}\n${logs()}`,
    );

    // Beyond one Prometheus: a second one federating the first with the shipped federation.yml
    // (over plain HTTP here: the test's Prometheus serves no TLS) gets every host's series with its
    // own instance label and the same values.
    const federating = await startPrometheus('', { scrapeConfigs: shippedFederationJob(prom.url.replace('http://', '')) });
    cleanups.push(() => federating.stop());
    const settled = await stored();
    await pollFor(
      async () => {
        const r = await federating.query(`${METRIC.packageEnergy}{job="vmsr"}`);
        const got = new Map(r.map((s) => [s.metric.instance!, Number(s.value[1])]));
        return hosts.every((h) => got.get(h.target) === settled.get(h.target)) ? true : undefined;
      },
      'the federating Prometheus to hold each host value',
      () => `${federating.log()}\n${logs()}`,
    );

    // One host goes down: its up turns 0 and the alert fires for it alone.
    const down = hosts[1]!;
    await down.exporter.stop();
    const firing = await pollFor(
      async () => {
        const r = await prom.query('ALERTS{alertname="VmsrExporterDown",alertstate="firing"}');
        return r.length > 0 ? r.map((s) => s.metric.instance) : undefined;
      },
      'the alert to fire',
      logs,
    );
    expect(firing).toEqual([down.target]);
    const upNow = await prom.query('up{job="vmsr"} == 0');
    expect(upNow.map((s) => s.metric.instance)).toEqual([down.target]);
  });

  test('the shipped scrape, federation and remote-write configurations pass promtool check config', (ctx) => {
    const why = missing({ command: 'promtool' });
    if (why) ctx.skip(why);
    for (const f of ['vmsr-fleet-scrape.yml', 'federation.yml', 'remote-write.yml'])
      expect(execFileSync('promtool', ['check', 'config', path.join(CONTRIB, f)], { encoding: 'utf8' }), f).toContain('SUCCESS');
  });
});
