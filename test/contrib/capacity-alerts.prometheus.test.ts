/**
 * The capacity alerts against real parts: the helper daemon run with a discovery cap of 2 and an
 * open-file limit of 400 (prlimit), fake QEMU processes it discovers, one process with many threads
 * registered over v2, the exporter, and Debian's prometheus running the shipped example
 * configuration with the shipped alert rules (their `for:` held to a few seconds, nothing else
 * changed). The daemon's cap fills and VmsrHelperVmCapFull fires for cap="discovery"; the
 * registration takes the fds down to under 5 % of the limit and VmsrHelperFdBudgetFull fires. The
 * series say what the daemon has: its caps, the VMs counted against them, its fds.
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

describe('the capacity alerts on a live daemon', () => {
  test('a full discovery cap and a short fd budget show in the series and fire the shipped alerts', { timeout: 150_000 }, async (ctx) => {
    const why = missing({ command: 'prometheus' }) ?? missing({ command: 'prlimit' });
    if (why) return ctx.skip(why);
    const dir = tempDir('vmsr-capacity-');
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
    const h = new MovingHost();
    cleanups.push(() => h.cleanup());
    h.pump(20);
    const sock = path.join(dir, 'helper.sock');
    const daemon = await startHelper(
      ['-k', sock, '--interval', '0.25', '--max-discovered-vms', String(DISCOVERY_CAP), ...hostArgs(h.host)],
      { command: ['prlimit', `--nofile=${FD_LIMIT}:${FD_LIMIT}`, process.execPath, BIN] },
    );
    cleanups.push(() => daemon.stop());
    // One more VM process than the cap holds (other QEMUs on this machine may take slots too: the cap fills either way).
    for (let i = 0; i <= DISCOVERY_CAP; i++) {
      const vm = await new FakeQemu({ vcpus: 1, args: ['-name', `cap-${i}`] }).ready();
      cleanups.push(() => vm.kill());
    }
    const exporter = await startExporterChild(sock);
    cleanups.push(() => exporter.stop());
    const rulesDir = path.join(dir, 'rules');
    fs.mkdirSync(rulesDir);
    ruleFilesHeldFor(rulesDir, '3s');
    const prom = await startPrometheusWith(
      adaptedExample(path.join(PROMETHEUS_DIR, 'vmsr-prometheus.example.yml'), new URL(exporter.url).host, rulesDir),
    );
    cleanups.push(() => prom.stop());
    const logs = () => `--- prometheus:\n${prom.log()}\n--- exporter:\n${exporter.stderr()}\n--- daemon:\n${daemon.stderr()}`;
    const value = async (q: string): Promise<number | undefined> => {
      const r = await prom.query(q);
      return r.length === 1 ? Number(r[0]!.value[1]) : undefined;
    };
    const firing = async (alert: string) => (await prom.query(`ALERTS{alertname="${alert}",alertstate="firing"}`)).map((s) => s.metric);

    // The discovery cap fills: the series say 2 of 2, the daemon says why the third VM is not
    // tracked, and the shipped alert fires for that cap alone.
    const capFull = await pollFor(
      async () => {
        const f = await firing('VmsrHelperVmCapFull');
        return f.length > 0 ? f : undefined;
      },
      'VmsrHelperVmCapFull to fire',
      logs,
      90_000,
    );
    expect(capFull).toEqual([expect.objectContaining({ cap: 'discovery', severity: 'warning', job: 'vmsr' })]);
    expect(await value(`${CAPACITY_METRIC.vmCap}{cap="discovery"}`)).toBe(DISCOVERY_CAP);
    expect(await value(`${CAPACITY_METRIC.vmCapUsed}{cap="discovery"}`)).toBe(DISCOVERY_CAP);
    expect(await value(`${CAPACITY_METRIC.vmCap}{cap="registration"}`)).toBe(1024);
    expect(await value(`${CAPACITY_METRIC.vmCapUsed}{cap="registration"}`)).toBe(0);
    expect(daemon.stderr()).toContain(`discovery tracks ${DISCOVERY_CAP} VMs, its cap; raise --max-discovered-vms`);
    expect(await firing('VmsrHelperVmCapNearFull')).toEqual([]);

    // The fd budget: the limit prlimit set; before the registration, more than 5 % of it is left.
    expect(await value(CAPACITY_METRIC.maxFds)).toBe(FD_LIMIT);
    const open = (await value(CAPACITY_METRIC.openFds))!;
    const available = (await value(CAPACITY_METRIC.fdsAvailable))!;
    expect(open).toBeGreaterThan(10);
    expect(open + available).toBeLessThanOrEqual(FD_LIMIT);
    expect(available, logs()).toBeGreaterThan(0.05 * FD_LIMIT + 30);
    expect(await firing('VmsrHelperFdBudgetFull')).toEqual([]);

    // A process whose threads take nearly all of what is left (two fds a thread and one for its
    // task listing; a few spare for its statistics file and a discovered VM changing), registered.
    const threads = Math.floor((available - 12) / 2);
    const hog = await new FakeQemu({ vcpus: threads - 1, argv0: 'fd-hog', comm: 'fd-hog', vcpuNames: false }).ready();
    cleanups.push(() => hog.kill());
    const client = await V2Client.connect(sock);
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
    expect(fdFull).toEqual([expect.objectContaining({ severity: 'warning', job: 'vmsr' })]);
    const left = (await value(CAPACITY_METRIC.fdsAvailable))!;
    expect(left).toBeLessThan(0.05 * FD_LIMIT);
    expect(await value(CAPACITY_METRIC.openFds)).toBeGreaterThanOrEqual(open + 2 * threads);
    expect(await value(`${CAPACITY_METRIC.vmCapUsed}{cap="registration"}`)).toBe(1);
    // Admitted with little room left, it is still sampled whole: its fds were counted once.
    expect(daemon.stderr()).not.toContain(`"pid":${hog.pid},"uid":0},"threads"`);
    // The alert's text names what is left and the fix, as the shipped rule words it.
    const alerts = (await (await fetch(`${prom.url}/api/v1/alerts`)).json()) as {
      data: { alerts: { labels: { alertname: string }; annotations: { summary: string; description: string }; state: string }[] };
    };
    const fd = alerts.data.alerts.find((a) => a.labels.alertname === 'VmsrHelperFdBudgetFull' && a.state === 'firing')!;
    expect(fd.annotations.summary).toMatch(/^vmsr helper on 127\.0\.0\.1:\d+ is short of file descriptors \(\d+ left\)$/);
    expect(fd.annotations.description).toContain('Raise LimitNOFILE= of qemu-vmsr-helper.service');
  });
});
