/**
 * The Grafana dashboard and the shipped rules against real parts: the helper daemon on a moving fake
 * host, fake QEMU processes it discovers in /proc, `vmsr-helper exporter`, and Debian's prometheus
 * running the shipped example configuration (scraping every second, the shipped rules loaded).
 * Every dashboard query, its template variables substituted as Grafana would, returns data; every
 * rule is healthy and every recorded series exists; the Kepler relabeling example gives Kepler's
 * names.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { tempDir } from '../daemon/support/daemon-process.js';
import { V2Client } from '../../src/client/v2-client.js';
import { missing } from '../support/env.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { pollFor } from '../support/wait.js';
import { MovingHost, startDaemon, startExporterChild, startPrometheusWith, type PrometheusServer } from '../exporter/support/stack.js';
import { PROMETHEUS_DIR, adaptedExample, ruleFiles, rulesIn } from './support/contrib-files.js';
import { MSR_DRAM_ENERGY_STATUS, MSR_PP0_ENERGY_STATUS } from '../../src/msr/registers.js';
import {
  BUILTIN_INTERVALS,
  allPanels,
  dashboardTargets,
  labelValuesQuery,
  loadDashboard,
  substitute,
  type TemplateVariable,
} from './support/dashboard-queries.js';

const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const TAG = `${process.pid}-${Date.now() % 100000}`;
/** Our VM: a fake QEMU with a name, a uuid and two virtual packages, both vCPUs spinning. */
const VM = { name: `dash-${TAG}`, uuid: '5c3f0e0a-7d1b-4c55-9a1e-0123456789ab' };

interface Stack {
  exporterHost: string;
  logs(): string;
}

let stack: Promise<Stack> | undefined;
/** The daemon (discovery on), our fake QEMU and the exporter, started once for the tests that need them. */
function liveStack(): Promise<Stack> {
  return (stack ??= (async () => {
    const h = new MovingHost();
    cleanups.push(() => h.cleanup());
    h.pump(50);
    // The host reads its cores' and DRAM's energy beside the package's: the domain panels and rules have them.
    h.pumpDomains([MSR_PP0_ENERGY_STATUS, MSR_DRAM_ENERGY_STATUS], 20);
    const dir = tempDir('vmsr-dash-');
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
    const sock = path.join(dir, 'helper.sock');
    const daemon = await startDaemon(h, sock);
    cleanups.push(() => daemon.stop());
    const vm = await new FakeQemu({ vcpus: 2, args: ['-name', VM.name, '-uuid', VM.uuid, '-smp', '2,sockets=2'] }).ready();
    cleanups.push(() => vm.kill());
    await vm.cmd('spin 0');
    await vm.cmd('spin 1');
    // A power limit far above what it draws (nothing throttled, no cgroup touched): the limit panel has its series.
    const c = await V2Client.connect(sock);
    const listed = await pollFor(async () => (await c.list()).find((v) => v.pid === vm.pid), 'discovery to list our VM', daemon.stderr);
    await c.limit(listed.hostVmId, 1000);
    await c.close();
    const exporter = await startExporterChild(sock);
    cleanups.push(() => exporter.stop());
    return {
      exporterHost: new URL(exporter.url).host,
      logs: () => `--- exporter:\n${exporter.stderr()}\n--- daemon:\n${daemon.stderr()}`,
    };
  })());
}

async function prometheus(example: string, s: Stack): Promise<PrometheusServer> {
  const p = await startPrometheusWith(adaptedExample(path.join(PROMETHEUS_DIR, example), s.exporterHost));
  cleanups.push(() => p.stop());
  return p;
}

/** What the variable's label_values() offers, from Prometheus's label API (as Grafana asks it). */
async function variableValues(prom: PrometheusServer, v: TemplateVariable, values: Record<string, string>): Promise<string[]> {
  const { selector, label } = labelValuesQuery(v);
  const r = await fetch(`${prom.url}/api/v1/label/${label}/values?match[]=${encodeURIComponent(substitute(selector, values))}`);
  return ((await r.json()) as { data: string[] }).data;
}

const noPrometheus = () => missing({ command: 'prometheus' });
const SKIP = 'prometheus not installed (apt-get install prometheus; .ci/run does)';

describe('the Grafana dashboard and the shipped rules', () => {
  test('the dashboard is Grafana JSON with a datasource variable, host and VM variables, every panel on that datasource', () => {
    const d = loadDashboard();
    expect(d.schemaVersion).toBe(39);
    expect(d.uid).toMatch(/^[\w-]{1,40}$/);
    const vars = new Map(d.templating.list.map((v) => [v.name, v]));
    expect([...vars.keys()]).toEqual(['datasource', 'instance', 'vm']);
    expect(vars.get('datasource')!.type).toBe('datasource');
    expect(vars.get('instance')!.type).toBe('query');
    // All VMs is ".*", so that VMs without a name (name="") are in it too.
    expect(vars.get('vm')).toMatchObject({ type: 'query', includeAll: true, multi: true, allValue: '.*' });
    const panels = allPanels(d);
    const ids = panels.map((p) => (p as { id?: number }).id);
    expect(new Set(ids).size).toBe(ids.length);
    for (const p of panels.filter((x) => x.type !== 'row')) {
      expect((p as { datasource?: unknown }).datasource, p.title).toEqual({ type: 'prometheus', uid: '${datasource}' });
      expect(p.targets?.length, p.title).toBeGreaterThan(0);
    }
    // Panels do not overlap on Grafana's 24-column grid.
    const boxes = panels.map((p) => ({ title: p.title, ...p.gridPos! }));
    for (const [i, a] of boxes.entries()) {
      expect(a.x + a.w, a.title).toBeLessThanOrEqual(24);
      for (const b of boxes.slice(i + 1)) {
        const overlap = a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
        expect(overlap, `${a.title} overlaps ${b.title}`).toBe(false);
      }
    }
    const exprs = dashboardTargets(d).map((t) => t.expr);
    // Per host, per VM, health: the families the dashboard is for are all on it.
    for (const family of [
      'instance_vm:vmsr_vm_energy_joules:rate1m',
      'instance:vmsr_unattributed_energy_joules:rate1m',
      'instance_package:vmsr_host_package_energy_joules:rate1m',
      'instance_vm_vpkg:vmsr_vm_energy_joules:rate1m',
      'vmsr_vm_energy_joules_total',
      'vmsr_exporter_helper_connected',
      'vmsr_helper_samples_total',
      'vmsr_helper_sample_failures_total',
      'vmsr_helper_legacy_requests_total',
      'vmsr_helper_vm_cap_used',
      'vmsr_helper_fds_available',
      'vmsr_energy_source_info',
      'vmsr_vm_power_limit_watts',
      'vmsr_vm_power_limited_seconds_total',
    ]) {
      expect(
        exprs.some((e) => e.includes(family)),
        family,
      ).toBe(true);
    }
    // A host on synthetic energy is flagged twice: the first panel under the Host row, and an annotation.
    const source = d.panels.find((p) => p.title === 'Energy source')!;
    expect(source.targets![0]!.expr).toBe('vmsr_energy_source_info{instance="$instance"}');
    expect(JSON.stringify(source)).toContain('SYNTHETIC energy: not a measurement');
    const note = d.annotations.list.find((a) => a.name === 'Synthetic energy')!;
    expect(note).toMatchObject({ enable: true, expr: 'vmsr_energy_source_info{source="synthetic", instance="$instance"} == 1' });
  });

  test(
    'every dashboard query and every shipped rule returns data from a Prometheus that scraped a live exporter',
    { timeout: 150_000 },
    async (ctx) => {
      if (noPrometheus()) return ctx.skip(SKIP);
      const s = await liveStack();
      const prom = await prometheus('vmsr-prometheus.example.yml', s);
      const logs = () => `--- prometheus:\n${prom.log()}\n${s.logs()}`;
      const ours = `name="${VM.name}"`;
      // Ready when the slowest series are: our VM's power per virtual package (discovery, then two
      // scrapes), and the unattributed share (two evaluations of the rules).
      await pollFor(
        async () => {
          const [vpkgs, share] = await Promise.all([
            prom.query(`instance_vm_vpkg:vmsr_vm_energy_joules:rate1m{${ours},domain="package"} > 0`),
            prom.query('instance_package:vmsr_host_package_unattributed_energy:ratio_rate1m'),
          ]);
          return vpkgs.length === 2 && share.length > 0 ? true : undefined;
        },
        'our VM with power on both virtual packages, and the unattributed share, in Prometheus',
        logs,
        90_000,
      );

      // The template variables as Grafana fills them: the host from its query; the VM both as ours
      // picked from the list and as "All".
      const d = loadDashboard();
      const vars = new Map(d.templating.list.map((v) => [v.name, v]));
      const instances = await variableValues(prom, vars.get('instance')!, {});
      expect(instances).toContain(s.exporterHost);
      const vms = await variableValues(prom, vars.get('vm')!, { instance: s.exporterHost });
      expect(vms).toContain(VM.name);

      const targets = dashboardTargets(d);
      expect(targets.length).toBeGreaterThanOrEqual(15);
      const empty: string[] = []; // queries that answered nothing, and legends naming a missing label
      for (const vm of [VM.name, vars.get('vm')!.allValue!]) {
        const values = { ...BUILTIN_INTERVALS, datasource: 'prometheus', instance: s.exporterHost, vm };
        for (const t of targets) {
          const q = substitute(t.expr, values);
          const r = await prom.query(q);
          if (r.length === 0) empty.push(`${t.panel} / ${t.refId}: ${q}`);
          // A legend's {{label}} is one the query's series carry (a label left out by a sum would print nothing).
          for (const l of t.legendLabels)
            if (!r.some((x) => l in x.metric)) empty.push(`${t.panel} / ${t.refId}: no ${l} label for its legend`);
        }
      }
      expect(empty, logs()).toEqual([]);

      // The energy source: this stack's daemon reads (fake) MSRs, so the panel says msr and the
      // synthetic annotation finds nothing; the same query for the source it has finds this host.
      const values = { ...BUILTIN_INTERVALS, datasource: 'prometheus', instance: s.exporterHost, vm: VM.name };
      const sources = await prom.query(substitute('vmsr_energy_source_info{instance="$instance"}', values));
      expect(sources.map((x) => x.metric.source)).toEqual(['msr']);
      const annotation = substitute(d.annotations.list.find((a) => a.name === 'Synthetic energy')!.expr!, values);
      expect(await prom.query(annotation)).toEqual([]);
      expect(await prom.query(annotation.replace('source="synthetic"', 'source="msr"'))).toHaveLength(1);

      // Every shipped rule is loaded and healthy, every recorded series exists, and on a healthy
      // stack no alert is pending or firing.
      const rules = (await (await fetch(`${prom.url}/api/v1/rules`)).json()) as {
        data: { groups: { file: string; rules: { name: string; type: string; health: string; lastError?: string }[] }[] };
      };
      const loaded = rules.data.groups.flatMap((g) => g.rules);
      const shipped = ruleFiles().flatMap(rulesIn);
      expect(loaded.map((r) => r.name).sort()).toEqual(shipped.map((r) => r.name).sort());
      for (const r of loaded) expect(`${r.name}: ${r.health} ${r.lastError ?? ''}`).toBe(`${r.name}: ok `);
      // Each group is evaluated on its own schedule: a group's first rate() needs two scrapes after its start.
      const records = shipped.filter((x) => x.kind === 'record').map((x) => x.name);
      const missingRecords = async () => {
        const none: string[] = [];
        for (const name of records) if ((await prom.query(name)).length === 0) none.push(name);
        return none;
      };
      await pollFor(async () => ((await missingRecords()).length === 0 ? true : undefined), 'every recorded series', logs, 20_000).catch(
        () => undefined,
      );
      expect(await missingRecords(), logs()).toEqual([]);
      // One exception: a scrape over its timeout (1 s, the scrape interval) on a loaded machine sets
      // up to 0 for a moment, and VmsrExporterDown is then pending (it fires after 5 minutes of it).
      const alerts = (await (await fetch(`${prom.url}/api/v1/alerts`)).json()) as {
        data: { alerts: { labels: { alertname: string }; state: string }[] };
      };
      expect(
        alerts.data.alerts.filter((a) => !(a.labels.alertname === 'VmsrExporterDown' && a.state === 'pending')),
        logs(),
      ).toEqual([]);

      // Kepler's names, recorded: one series for our VM (its two virtual packages summed) per RAPL
      // domain, Kepler's zone, named by its uuid.
      const kepler = await prom.query(`kepler_vm_cpu_joules_total{vm_name="${VM.name}"}`);
      expect(kepler.map((k) => k.metric.zone).sort()).toEqual(['core', 'dram', 'package']);
      for (const k of kepler)
        expect(k.metric).toEqual(expect.objectContaining({ vm_id: VM.uuid, hypervisor: 'kvm', state: 'running', node_name: '127.0.0.1' }));
      expect(kepler.some((k) => 'domain' in k.metric)).toBe(false);

      // The domain panels: the host's power and our VM's per RAPL domain, each domain the host reads.
      const domains = async (q: string) => (await prom.query(q)).map((x) => x.metric.domain).sort();
      expect(await domains(`instance:vmsr_host_package_energy_joules:rate1m{instance="${s.exporterHost}"} > 0`)).toEqual([
        'core',
        'dram',
        'package',
      ]);
      expect(await domains(`instance_vm:vmsr_vm_energy_joules:rate1m{${ours}} > 0`)).toEqual(['core', 'dram', 'package']);
    },
  );

  test("the Kepler relabeling example gives Kepler names and labels to a live exporter's series", { timeout: 150_000 }, async (ctx) => {
    if (noPrometheus()) return ctx.skip(SKIP);
    const s = await liveStack();
    const prom = await prometheus('vmsr-kepler-relabel.example.yml', s);
    const logs = () => `--- prometheus:\n${prom.log()}\n${s.logs()}`;
    // A Kepler dashboard's query: power per VM name from the energy counter.
    const watts = await pollFor(
      async () => {
        const r = await prom.query(`sum by (vm_name, vm_id) (rate(kepler_vm_cpu_joules_total{zone="package", vm_name="${VM.name}"}[5s]))`);
        return r.length === 1 && Number(r[0]!.value[1]) > 0 ? r[0]! : undefined;
      },
      'our VM under kepler_vm_cpu_joules_total with power',
      logs,
      90_000,
    );
    expect(watts.metric).toEqual({ vm_name: VM.name, vm_id: VM.uuid });
    const series = await prom.query(`kepler_vm_cpu_watts{vm_name="${VM.name}"}`);
    // One series per virtual package and RAPL domain (Kepler's zone), without vmsr's domain label.
    expect(series.map((x) => `${x.metric.zone} ${x.metric.vpkg}`).sort()).toEqual([
      'core 0',
      'core 1',
      'dram 0',
      'dram 1',
      'package 0',
      'package 1',
    ]);
    for (const x of series) {
      expect(x.metric).toMatchObject({ hypervisor: 'kvm', state: 'running', node_name: '127.0.0.1' });
      expect(x.metric.domain).toBeUndefined();
    }
    expect((await prom.query('kepler_node_cpu_joules_total{zone="package"}')).length).toBeGreaterThan(0);
    expect((await prom.query('kepler_node_cpu_joules_total{zone="dram"}')).length).toBeGreaterThan(0);
    // The series the job keeps under vmsr names keep their domain.
    expect((await prom.query('vmsr_host_package_unattributed_energy_joules_total{domain="dram"}')).length).toBeGreaterThan(0);
    // The vmsr names of this job are gone: renamed, not copied.
    expect(await prom.query('vmsr_vm_energy_joules_total')).toEqual([]);
  });

  test("the relabeling example's commented rules give the per-domain names of Kepler before 0.10", { timeout: 150_000 }, async (ctx) => {
    if (noPrometheus()) return ctx.skip(SKIP);
    const s = await liveStack();
    // The example as its comment says to use it: the three renames out, the commented rules in.
    const shipped = adaptedExample(path.join(PROMETHEUS_DIR, 'vmsr-kepler-relabel.example.yml'), s.exporterHost);
    const renames = /^ {6}# The names last[\s\S]*?(?=^ {6}# `domain` went into `zone`)/m;
    expect(shipped).toMatch(renames);
    const commented = /^ {6}# {3}(- source_labels| {2}regex| {2}target_label| {2}replacement)/gm;
    const config = shipped.replace(renames, '').replace(commented, '      $1');
    expect(config).not.toBe(shipped.replace(renames, ''));
    const p = await startPrometheusWith(config);
    cleanups.push(() => p.stop());
    const logs = () => `--- prometheus:\n${p.log()}\n${s.logs()}`;
    const names = async (q: string) => (await p.query(q)).map((x) => x.metric.__name__!).sort();
    const vm = await pollFor(
      async () => {
        const r = await names(`{__name__=~"kepler_vm_.+_joules_total", vm_name="${VM.name}", vpkg="0"}`);
        return r.length === 3 ? r : undefined;
      },
      'our VM under the per-domain Kepler names',
      logs,
      90_000,
    );
    expect(vm).toEqual(['kepler_vm_core_joules_total', 'kepler_vm_dram_joules_total', 'kepler_vm_package_joules_total']);
    expect(await names('{__name__=~"kepler_node_.+_joules_total"}')).toEqual([
      'kepler_node_core_joules_total',
      'kepler_node_dram_joules_total',
      'kepler_node_package_joules_total',
    ]);
  });
});
