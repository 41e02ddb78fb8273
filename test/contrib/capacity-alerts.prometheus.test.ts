/**
 * The capacity alerts against real parts: two helper daemons, each with its exporter, scraped by
 * Debian's prometheus running the shipped example configuration with the shipped alert rules (their
 * `for:` held to a few seconds, nothing else changed). One daemon has a discovery cap of 2 and fake
 * QEMU processes it discovers: its cap fills and VmsrHelperVmCapFull fires for cap="discovery". The
 * other runs under an open-file limit of 400 (prlimit) without discovery (so no other QEMU of this
 * machine comes or goes in its fds), and one process of many threads is registered on it: its fds
 * fall under 5 % of the limit and VmsrHelperFdBudgetFull fires for it alone. The series say what
 * each daemon has: its caps, the VMs counted against them, its fds.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { CAPACITY_METRIC } from '../../src/exporter/helper-capacity.js';
import { BIN, hostArgs, startHelper, tempDir } from '../daemon/support/daemon-process.js';
import { missing } from '../support/env.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { pollFor } from '../support/wait.js';
import { MovingHost, startExporterChild, startPrometheusWith } from '../exporter/support/stack.js';
import { PROMETHEUS_DIR, adaptedExample, ruleFilesHeldFor } from './support/contrib-files.js';

const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const FD_LIMIT = 400;
const DISCOVERY_CAP = 2;

describe('the capacity alerts on live daemons', () => {
  test(
    'a full discovery cap and a short fd budget show in the series and fire the shipped alerts for their hosts',
    { timeout: 150_000 },
    async (ctx) => {
      const why = missing({ command: 'prometheus' }) ?? missing({ command: 'prlimit' });
      if (why) return ctx.skip(why);
      const dir = tempDir('vmsr-capacity-');
      cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
      const h = new MovingHost();
      cleanups.push(() => h.cleanup());
      h.pump(20);

      // The daemon whose discovery cap fills: one more VM process than the cap holds. Other users'
      // QEMUs on this machine may take slots too, up to the others' share: this test's processes are
      // preferred owners (root's, or of the socket's group, whoever runs the suite), bound by the cap
      // alone, so the cap fills either way.
      const capSock = path.join(dir, 'cap.sock');
      const capDaemon = await startHelper([
        '-k',
        capSock,
        '--interval',
        '0.25',
        '--max-discovered-vms',
        String(DISCOVERY_CAP),
        '--socket-group',
        String(process.getgid!()),
        ...hostArgs(h.host),
      ]);
      cleanups.push(() => capDaemon.stop());
      for (let i = 0; i <= DISCOVERY_CAP; i++) {
        const vm = await new FakeQemu({ vcpus: 1, args: ['-name', `cap-${i}`] }).ready();
        cleanups.push(() => vm.kill());
      }
      const capExporter = await startExporterChild(capSock);
      cleanups.push(() => capExporter.stop());

      // The daemon short of fds.
      const fdSock = path.join(dir, 'fd.sock');
      const fdDaemon = await startHelper(['-k', fdSock, '--interval', '0.25', '--no-discovery', ...hostArgs(h.host)], {
        command: ['prlimit', `--nofile=${FD_LIMIT}:${FD_LIMIT}`, process.execPath, BIN],
      });
      cleanups.push(() => fdDaemon.stop());
      const fdExporter = await startExporterChild(fdSock);
      cleanups.push(() => fdExporter.stop());

      const capHost = new URL(capExporter.url).host;
      const fdHost = new URL(fdExporter.url).host;
      const rulesDir = path.join(dir, 'rules');
      fs.mkdirSync(rulesDir);
      ruleFilesHeldFor(rulesDir, '3s');
      const prom = await startPrometheusWith(
        adaptedExample(path.join(PROMETHEUS_DIR, 'vmsr-prometheus.example.yml'), [capHost, fdHost], rulesDir),
      );
      cleanups.push(() => prom.stop());
      const logs = () =>
        [
          `--- prometheus:\n${prom.log()}`,
          `--- exporters:\n${capExporter.stderr()}\n${fdExporter.stderr()}`,
          `--- daemon with the cap:\n${capDaemon.stderr()}`,
          `--- daemon short of fds:\n${fdDaemon.stderr()}`,
        ].join('\n');
      const value = async (q: string): Promise<number | undefined> => {
        const r = await prom.query(q);
        return r.length === 1 ? Number(r[0]!.value[1]) : undefined;
      };
      const firing = async (alert: string) => (await prom.query(`ALERTS{alertname="${alert}",alertstate="firing"}`)).map((s) => s.metric);
      const on = (host: string) => `instance="${host}"`;

      // The discovery cap fills: the series say 2 of 2, the daemon says why the third VM is not
      // tracked, and the shipped alert fires for that host and cap alone.
      const capFull = await pollFor(
        async () => {
          const f = await firing('VmsrHelperVmCapFull');
          return f.length > 0 ? f : undefined;
        },
        'VmsrHelperVmCapFull to fire',
        logs,
        90_000,
      );
      expect(capFull).toEqual([expect.objectContaining({ cap: 'discovery', severity: 'warning', job: 'vmsr', instance: capHost })]);
      expect(await value(`${CAPACITY_METRIC.vmCap}{${on(capHost)},cap="discovery"}`)).toBe(DISCOVERY_CAP);
      expect(await value(`${CAPACITY_METRIC.vmCapUsed}{${on(capHost)},cap="discovery"}`)).toBe(DISCOVERY_CAP);
      expect(await value(`${CAPACITY_METRIC.vmCap}{${on(capHost)},cap="registration"}`)).toBe(1024);
      expect(await value(`${CAPACITY_METRIC.vmCapUsed}{${on(capHost)},cap="registration"}`)).toBe(0);
      expect(capDaemon.stderr()).toContain(`discovery tracks ${DISCOVERY_CAP} VMs, its cap; raise --max-discovered-vms`);
      expect(await firing('VmsrHelperVmCapNearFull')).toEqual([]);
      // Without discovery there is no discovery cap, and no series of it.
      expect(await prom.query(`${CAPACITY_METRIC.vmCap}{${on(fdHost)},cap="discovery"}`)).toEqual([]);

      // The fd budget: the limit prlimit set; before the registration, more than 5 % of it is left.
      expect(await value(`${CAPACITY_METRIC.maxFds}{${on(fdHost)}}`)).toBe(FD_LIMIT);
      const open = (await value(`${CAPACITY_METRIC.openFds}{${on(fdHost)}}`))!;
      const available = (await value(`${CAPACITY_METRIC.fdsAvailable}{${on(fdHost)}}`))!;
      expect(open).toBeGreaterThan(10);
      expect(open + available).toBeLessThanOrEqual(FD_LIMIT);
      expect(available, logs()).toBeGreaterThan(0.05 * FD_LIMIT + 30);
      expect(await firing('VmsrHelperFdBudgetFull')).toEqual([]);

      // A process whose threads take nearly all of what is left (two fds a thread but the main
      // thread's one, one for its task listing, and a few spare for its statistics file), registered.
      const threads = Math.floor((available - 12) / 2);
      const hog = await new FakeQemu({ vcpus: threads - 1, argv0: 'fd-hog', comm: 'fd-hog', vcpuNames: false }).ready();
      cleanups.push(() => hog.kill());
      const client = await V2Client.connect(fdSock);
      cleanups.push(() => client.close());
      await client.register({ pid: hog.pid, vcpus: [{ tid: hog.pid, vpkg: 0 }] });

      const fdFull = await pollFor(
        async () => {
          const f = await firing('VmsrHelperFdBudgetFull');
          return f.length > 0 ? f : undefined;
        },
        'VmsrHelperFdBudgetFull to fire',
        logs,
        60_000,
      );
      expect(fdFull).toEqual([expect.objectContaining({ severity: 'warning', job: 'vmsr', instance: fdHost })]);
      expect(await value(`${CAPACITY_METRIC.fdsAvailable}{${on(fdHost)}}`)).toBeLessThan(0.05 * FD_LIMIT);
      // Its kept fds (2 x threads - 1) are open beside the others. The count before was written
      // while the exporter connected (the daemon idles without a VM), with the copy of the host's
      // file being handed out among them: a couple of fds either way.
      expect(await value(`${CAPACITY_METRIC.openFds}{${on(fdHost)}}`)).toBeGreaterThanOrEqual(open + 2 * threads - 3);
      expect(await value(`${CAPACITY_METRIC.vmCapUsed}{${on(fdHost)},cap="registration"}`)).toBe(1);
      // Admitted with little room left, it is still sampled whole: its fds were counted once.
      expect(fdDaemon.stderr()).not.toContain('VM not sampled whole');
      // The alert's text names what is left and the fix, as the shipped rule words it.
      const alerts = (await (await fetch(`${prom.url}/api/v1/alerts`)).json()) as {
        data: { alerts: { labels: { alertname: string }; annotations: { summary: string; description: string }; state: string }[] };
      };
      const fd = alerts.data.alerts.find((a) => a.labels.alertname === 'VmsrHelperFdBudgetFull' && a.state === 'firing')!;
      expect(fd.annotations.summary).toMatch(new RegExp(`^vmsr helper on ${fdHost} is short of file descriptors \\(\\d+ left\\)$`));
      expect(fd.annotations.description).toContain('Raise LimitNOFILE= of qemu-vmsr-helper.service');
    },
  );
});
