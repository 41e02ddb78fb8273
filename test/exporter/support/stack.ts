/**
 * The exporter's real surroundings for tests: the helper daemon as a child on a FakeHost whose
 * package energy keeps moving, the exporter as a child (`vmsr-helper exporter`), and a real
 * Prometheus server scraping it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { FakeHost } from '../../support/fake-host.js';
import { hostArgs, ROOT, spawnHelper, startHelper, tempDir, waitFor, type DaemonChild } from '../../daemon/support/daemon-process.js';

/** ESU 14: 61 µJ a unit. */
export const POWER_UNIT = 0xa0e03n;

/** A fake host (package id of each CPU; default two CPUs in package 0) whose packages draw power while pumped (FakeHost.pumpEnergy every 20 ms). */
export class MovingHost {
  readonly host: FakeHost;
  private stops: (() => void)[] = [];

  constructor(packages: number[] = [0, 0]) {
    this.host = new FakeHost({ packages });
  }

  /** Package `pkg` draws `watts` from now on. */
  pump(watts = 50, pkg = 0): void {
    this.stops.push(
      this.host.pumpEnergy({
        pkg,
        powerUnit: POWER_UNIT,
        start: 0xfff00000 /* wraps early */,
        units: Math.round(watts * 0.02 * 2 ** 14),
        everyMs: 20,
      }),
    );
  }

  /**
   * Package `pkg`'s RAPL domain registers `msrs` (MSR numbers) count from now on, `watts` each in
   * the ESU: called before the daemon starts, which then finds and reads those domains.
   */
  pumpDomains(msrs: readonly number[], watts = 10, pkg = 0): void {
    const cpus = this.host.cpusOf(pkg);
    for (const msr of msrs) this.host.setCounter(cpus, msr, 1000);
    const units = Math.round(watts * 0.02 * 2 ** 14);
    const t = setInterval(() => {
      for (const msr of msrs) this.host.addCounter(cpus, msr, units);
    }, 20);
    this.stops.push(() => clearInterval(t));
  }

  /** Every package stops drawing power (their counters stand still). */
  stopPumps(): void {
    for (const s of this.stops.splice(0)) s();
  }

  cleanup(): void {
    this.stopPumps();
    this.host.cleanup();
  }
}

export async function startDaemon(h: MovingHost, sock: string, extra: string[] = []): Promise<DaemonChild> {
  return startHelper(['-k', sock, '--interval', '0.25', ...hostArgs(h.host), ...extra]);
}

export interface ExporterChild extends DaemonChild {
  url: string;
}

/** The metrics URL the exporter logs once it serves ("Serving metrics on URL", field `url`), or null before. */
export function exporterUrlIn(log: string): string | null {
  return /"url":"(https?:\/\/[^"]+)"/.exec(log)?.[1] ?? null;
}

/** `vmsr-helper exporter` on an ephemeral loopback port (optionally as another uid/gid); resolves once it serves. */
export async function startExporterChild(
  sock: string,
  extra: string[] = [],
  opts: { uid?: number; gid?: number } = {},
): Promise<ExporterChild> {
  const child = spawnHelper(['exporter', '-k', sock, '--listen', '127.0.0.1:0', ...extra], opts);
  await waitFor(() => exporterUrlIn(child.stderr()) !== null, 'the exporter to serve', child);
  return { ...child, url: exporterUrlIn(child.stderr())! };
}

/** A free TCP port on loopback (bound, then released). */
export async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

export interface PrometheusServer {
  url: string;
  proc: ChildProcess;
  log(): string;
  query(q: string): Promise<{ metric: Record<string, string>; value: [number, string] }[]>;
  stop(): Promise<void>;
}

/**
 * The Debian prometheus package's server scraping `target` every second, storage in a temp dir; or,
 * given `config`, with that scrape_configs section (YAML lines, indented as under the key) and
 * those rule files.
 */
export async function startPrometheus(
  target: string,
  config?: { scrapeConfigs: string[]; ruleFiles?: string[] },
): Promise<PrometheusServer> {
  const scrape = config?.scrapeConfigs ?? ['  - job_name: vmsr', '    static_configs:', `      - targets: ['${target}']`];
  const rules = config?.ruleFiles?.length ? ['rule_files:', ...config.ruleFiles.map((f) => `  - ${JSON.stringify(f)}`)] : [];
  return startPrometheusWith(
    ['global:', '  scrape_interval: 1s', '  evaluation_interval: 1s', ...rules, 'scrape_configs:', ...scrape, ''].join('\n'),
  );
}

/** The Debian prometheus package's server with the configuration `config` (its text), storage in a temp dir. */
export async function startPrometheusWith(config: string): Promise<PrometheusServer> {
  const dir = tempDir('vmsr-prom-');
  const port = await freePort();
  fs.writeFileSync(path.join(dir, 'prometheus.yml'), config);
  const proc = spawn(
    'prometheus',
    [
      `--config.file=${path.join(dir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${path.join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let log = '';
  proc.stdout!.on('data', (d: Buffer) => (log += d.toString()));
  proc.stderr!.on('data', (d: Buffer) => (log += d.toString()));
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  const url = `http://127.0.0.1:${port}`;
  await waitFor(() => log.includes('Server is ready to receive web requests'), 'prometheus to start', { proc, stderr: () => log }, 30_000);
  return {
    url,
    proc,
    log: () => log,
    async query(q) {
      const r = await fetch(`${url}/api/v1/query?query=${encodeURIComponent(q)}`);
      const j = (await r.json()) as {
        status: string;
        error?: string;
        data: { result: { metric: Record<string, string>; value: [number, string] }[] };
      };
      if (j.status !== 'success') throw new Error(`prometheus query ${q}: ${j.error}`);
      return j.data.result;
    },
    async stop() {
      if (proc.exitCode === null) proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(t);
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The ```promql blocks of the README, without their comment lines. */
export function readmeQueries(): string[] {
  const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
  return [...readme.matchAll(/```promql\n([\s\S]*?)```/g)].map((m) =>
    m[1]!
      .split('\n')
      .filter((l) => l.trim() !== '' && !l.trim().startsWith('#'))
      .join(' '),
  );
}
