/**
 * Many hosts, one Prometheus: three "hosts" on distinct loopback addresses (127.0.0.2-4, the same
 * port on each), each with its own daemon on its own moving fake host, a VM registered on it (a
 * process busy on CPU 0 now and then) and its own exporter serving TLS with basic authentication,
 * scraped by one real Prometheus whose job is the shipped contrib/prometheus/vmsr-fleet-scrape.yml
 * with this test's CA, password and targets, and which loads the shipped recording and alert rules
 * (their `for:` held to 5 s so that an alert fires within the test; nothing else changed). Two more
 * jobs scrape the first host with a wrong password and over plain HTTP. Per host and per VM, the
 * totals Prometheus holds are the daemons' own and the energy pumped; the recording rules give one
 * host power and one VM power per instance; a host going down fires the shipped VmsrExporterDown
 * for it alone. A second Prometheus federates the first with the shipped federation.yml; the
 * shipped scrape, federation and remote-write files pass promtool.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { METRIC } from '../../src/exporter/metrics.js';
import { V2Client } from '../../src/client/v2-client.js';
import { pinnedChildMissing, startPinnedChild } from '../v2/harness.js';
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
import { ruleFilesHeldFor } from '../contrib/support/contrib-files.js';
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
  /** The host's VM: its process, and the daemon's client that registered it (and reads its energy). */
  vm: { pid: number; vmId: number; client: V2Client };
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
  test('per-host and per-VM totals are right, a wrong password and plain HTTP are down, and a host going down fires the shipped alert', async (ctx) => {
    const why = missing({ command: 'prometheus' }) ?? missing({ command: 'promtool' }) ?? pinnedChildMissing(0);
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
      // One registered VM keeps the helper sampling (without discovery: this machine runs other
      // QEMUs) and gets a share of the package: a process busy 10 ms of every 100 on CPU 0, which
      // is in the fake host's package 0.
      const vm = startPinnedChild(0, 10);
      cleanups.push(() => vm.kill());
      const client = await V2Client.connect(sock);
      cleanups.push(() => client.close());
      const { vmId } = await client.register({ pid: vm.pid, vcpus: [{ tid: vm.pid, vpkg: 0 }] });
      const exporter = await startExporterChild(sock, ['--listen', `${addr}:${port}`, '--web.config.file', web]);
      cleanups.push(() => exporter.stop());
      expect(exporter.url).toBe(`https://${addr}:${port}/metrics`);
      hosts.push({ addr, moving, daemon, exporter, target: `${addr}:${port}`, vm: { pid: vm.pid, vmId, client } });
    }

    // The shipped rules: recording, alerts, Kepler's names.
    const rulesDir = path.join(dir, 'rules');
    fs.mkdirSync(rulesDir);
    const rules = ruleFilesHeldFor(rulesDir, '5s');
    for (const r of rules) expect(execFileSync('promtool', ['check', 'rules', r], { encoding: 'utf8' }), r).toContain('SUCCESS');
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
    const prom: PrometheusServer = await startPrometheus('', { scrapeConfigs, ruleFiles: rules });
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

    // The shipped recording rules, per instance: one host power, and one VM power, that host's VM's.
    const recorded = await pollFor(
      async () => {
        const [host, vm] = await Promise.all([
          prom.query('instance:vmsr_host_package_energy_joules:rate1m{job="vmsr"} > 0'),
          prom.query('instance_vm:vmsr_vm_energy_joules:rate1m{job="vmsr"}'),
        ]);
        return host.length === 3 && vm.length === 3 ? { host, vm } : undefined;
      },
      'the recording rules to give a host power and a VM power per instance',
      logs,
    );
    for (const [i, h] of hosts.entries()) {
      const host = recorded.host.filter((x) => x.metric.instance === h.target);
      expect(host.length, h.target).toBe(1);
      expect(Number(host[0]!.value[1])).toBeLessThan(WATTS[i]! * 1.3);
      const vm = recorded.vm.filter((x) => x.metric.instance === h.target);
      expect(vm.map((x) => x.metric.pid)).toEqual([String(h.vm.pid)]);
      expect(Number(vm[0]!.value[1])).toBeLessThanOrEqual(Number(host[0]!.value[1]) * 1.01);
    }

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

    // Per VM: with the packages standing still again, each instance's VM total in Prometheus is the
    // daemon's own for that VM (READ, µJ), and per host the VMs' energy and the unattributed energy
    // add up to the package energy, as the daemon split it.
    const vmTotals = async (): Promise<Map<string, number>> =>
      new Map(
        (await prom.query(`${METRIC.vmEnergy}{job="vmsr"}`)).map((s) => [`${s.metric.instance}/${s.metric.pid}`, Number(s.value[1])]),
      );
    const daemonJoules = await Promise.all(hosts.map(async (h) => Number((await h.vm.client.read(h.vm.vmId, 0)).energyUj) / 1e6));
    await pollFor(
      async () => {
        const now = await vmTotals();
        // The same µJ (a float in joules may round its last bit differently).
        return hosts.every((h, i) => Math.abs(now.get(`${h.target}/${h.vm.pid}`)! - daemonJoules[i]!) < 1e-7) ? true : undefined;
      },
      "each instance's VM total to be its daemon's",
      () => `daemons: ${JSON.stringify(daemonJoules)}\n${logs()}`,
    );
    const vms = await vmTotals();
    expect(vms.size).toBe(3);
    for (const [i, h] of hosts.entries()) {
      // The VM got energy on every host (its process ran), and never more than the host's package.
      expect(daemonJoules[i], h.target).toBeGreaterThan(0);
      // The daemon has not moved since (the packages stand still).
      expect(Number((await h.vm.client.read(h.vm.vmId, 0)).energyUj) / 1e6).toBe(daemonJoules[i]);
    }
    const balance = await prom.query(
      `sum by (instance) (${METRIC.packageEnergy}{job="vmsr"}) - sum by (instance) (${METRIC.vmEnergy}{job="vmsr"}) - sum by (instance) (${METRIC.unattributedEnergy}{job="vmsr"})`,
    );
    expect(balance.map((b) => b.metric.instance).sort()).toEqual(hosts.map((h) => h.target).sort());
    // Each value is floored to a µJ on its own: the sums hold to a few µJ.
    for (const b of balance) expect(Math.abs(Number(b.value[1])), b.metric.instance).toBeLessThan(1e-5);

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

    // One host goes down: its up turns 0 and the shipped VmsrExporterDown fires for it alone (the
    // wrong-password and plain-HTTP jobs, down all along, are not job "vmsr": it does not select them).
    const down = hosts[1]!;
    await down.exporter.stop();
    const firing = await pollFor(
      async () => {
        const r = await prom.query('ALERTS{alertname="VmsrExporterDown",alertstate="firing"}');
        return r.length > 0 ? r.map((s) => s.metric) : undefined;
      },
      'the alert to fire',
      logs,
    );
    expect(firing).toEqual([expect.objectContaining({ instance: down.target, job: 'vmsr', severity: 'critical' })]);
    const upNow = await prom.query('up{job="vmsr"} == 0');
    expect(upNow.map((s) => s.metric.instance)).toEqual([down.target]);
    const alerts = (await (await fetch(`${prom.url}/api/v1/alerts`)).json()) as {
      data: { alerts: { labels: { alertname: string; instance?: string }; annotations: { summary: string }; state: string }[] };
    };
    const downAlert = alerts.data.alerts.find((a) => a.labels.alertname === 'VmsrExporterDown' && a.state === 'firing')!;
    expect(downAlert.annotations.summary).toBe(`vmsr exporter ${down.target} is down`);
  });

  test('the shipped scrape, federation and remote-write configurations pass promtool check config', (ctx) => {
    const why = missing({ command: 'promtool' });
    if (why) ctx.skip(why);
    for (const f of ['vmsr-fleet-scrape.yml', 'federation.yml', 'remote-write.yml'])
      expect(execFileSync('promtool', ['check', 'config', path.join(CONTRIB, f)], { encoding: 'utf8' }), f).toContain('SUCCESS');
  });
});
