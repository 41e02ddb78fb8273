/**
 * The RAPL domains through the whole chain: the helper daemon as a child on a fake host whose core
 * (PP0), DRAM and platform (PSYS) registers count beside the package's, a registered process as the
 * VM, `vmsr-helper exporter` as a child (it reads the daemon's statistics fds), and the Debian
 * prometheus server scraping it. Prometheus has every energy and power series once per domain under
 * `domain`, and once the host stands still its values are the daemon's own, as its statistics files
 * state them, to the microjoule.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { StatsReader, type StatsSample } from '../../src/client/stats-reader.js';
import { MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS, MSR_PP0_ENERGY_STATUS } from '../../src/msr/registers.js';
import { tempDir } from '../daemon/support/daemon-process.js';
import { missing } from '../support/env.js';
import { pollFor } from '../support/wait.js';
import { startChild } from '../v2/harness.js';
import { MovingHost, startDaemon, startExporterChild, startPrometheus } from './support/stack.js';

const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const DOMAINS = ['core', 'dram', 'package', 'psys'];

describe('the exporter on a host that reads other RAPL domains', () => {
  test(
    'Prometheus gets every energy and power series per domain, and their values are the daemon’s to the microjoule',
    { timeout: 150_000 },
    async (ctx) => {
      const why = missing({ command: 'prometheus' });
      if (why) return ctx.skip(`${why} (apt-get install prometheus; .ci/run does)`);
      const h = new MovingHost();
      cleanups.push(() => h.cleanup());
      h.pump(50);
      h.pumpDomains([MSR_PP0_ENERGY_STATUS, MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS], 20);
      const dir = tempDir('vmsr-domains-');
      cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
      const sock = path.join(dir, 'helper.sock');
      const daemon = await startDaemon(h, sock, ['--no-discovery']);
      cleanups.push(() => daemon.stop());
      const busy = startChild('spin');
      cleanups.push(() => busy.kill());
      const c = await V2Client.connect(sock);
      cleanups.push(() => c.close());
      const { vmId } = await c.register({ pid: busy.pid, vcpus: [{ tid: busy.pid, vpkg: 0 }] });
      const exporter = await startExporterChild(sock);
      cleanups.push(() => exporter.stop());
      const prom = await startPrometheus(new URL(exporter.url).host);
      cleanups.push(() => prom.stop());
      const logs = () => `--- prometheus:\n${prom.log()}\n--- exporter:\n${exporter.stderr()}\n--- daemon:\n${daemon.stderr()}`;
      const vm = `pid="${busy.pid}",vpkg="0"`;
      const domainsOf = async (q: string) => (await prom.query(q)).map((r) => r.metric.domain!).sort();

      // While the host draws power: every series of the VM and of the host, once per domain.
      await pollFor(
        async () => ((await domainsOf(`vmsr_vm_power_watts{${vm}} > 0`)).join() === DOMAINS.join() ? true : undefined),
        "the VM's power in every domain",
        logs,
        90_000,
      );
      expect(await domainsOf(`vmsr_vm_energy_joules_total{${vm}} > 0`)).toEqual(DOMAINS);
      expect(await domainsOf('vmsr_host_package_energy_joules_total{package="0"} > 0')).toEqual(DOMAINS);
      expect(await domainsOf('vmsr_host_package_unattributed_energy_joules_total{package="0"}')).toEqual(DOMAINS);
      expect(await domainsOf('vmsr_unattributed_energy_joules_total')).toEqual(DOMAINS);

      // The host stands still; once the daemon's files stop moving, Prometheus's values must be theirs.
      h.stopPumps();
      const vmFile = StatsReader.open((await c.statsFd(vmId)).fd);
      cleanups.push(() => vmFile.close());
      const hostFile = StatsReader.open((await c.statsFd(0)).fd);
      cleanups.push(() => hostFile.close());
      const at = (r: StatsReader, s: StatsSample, name: string, i = 0): number => Number(r.values(s, name)![i]!) / 1e6;
      const expected = (): Map<string, number> => {
        const v = vmFile.read();
        const hs = hostFile.read();
        const m = new Map<string, number>();
        for (const d of DOMAINS) {
          const pkg = d === 'package';
          m.set(`vmsr_vm_energy_joules_total{${vm},domain="${d}"}`, at(vmFile, v, pkg ? 'energy' : `${d}_energy`));
          const idx = pkg ? 0 : hostFile.values(hs, `${d}_package_id`)!.indexOf(0n);
          expect(idx, d).toBe(0);
          m.set(
            `vmsr_host_package_energy_joules_total{package="0",domain="${d}"}`,
            at(hostFile, hs, pkg ? 'package_energy' : `${d}_energy`, idx),
          );
          const un = at(hostFile, hs, pkg ? 'package_unattributed_energy' : `${d}_unattributed_energy`, idx);
          m.set(`vmsr_host_package_unattributed_energy_joules_total{package="0",domain="${d}"}`, un);
          // One package: the host-wide unattributed energy is that package's.
          m.set(`vmsr_unattributed_energy_joules_total{domain="${d}"}`, un);
        }
        return m;
      };
      let still = expected();
      await pollFor(
        async () => {
          await new Promise((r) => setTimeout(r, 600));
          const now = expected();
          const same = [...now].every(([k, v]) => still.get(k) === v);
          still = now;
          return same ? true : undefined;
        },
        "the daemon's files standing still",
        logs,
        30_000,
      );
      for (const [, v] of still) expect(v).toBeGreaterThan(0);
      const mismatches = async (): Promise<string[]> => {
        const out: string[] = [];
        for (const [q, want] of still) {
          const got = await prom.query(q);
          const v = got.length === 1 ? Number(got[0]!.value[1]) : NaN;
          if (!(Math.abs(v - want) <= 1e-9 * Math.max(1, want)))
            out.push(`${q}: Prometheus ${got.map((g) => g.value[1]).join()} , the daemon ${want}`);
        }
        return out;
      };
      await pollFor(
        async () => ((await mismatches()).length === 0 ? true : undefined),
        "Prometheus's values equal to the daemon's",
        logs,
        30_000,
      ).catch(() => undefined);
      expect(await mismatches(), logs()).toEqual([]);
      // The engine's rule, seen from Prometheus: per domain, the VM's energy and the unattributed energy add up to the host's.
      for (const d of DOMAINS) {
        const vmE = still.get(`vmsr_vm_energy_joules_total{${vm},domain="${d}"}`)!;
        const hostE = still.get(`vmsr_host_package_energy_joules_total{package="0",domain="${d}"}`)!;
        const un = still.get(`vmsr_unattributed_energy_joules_total{domain="${d}"}`)!;
        expect(Math.abs(vmE + un - hostE), d).toBeLessThanOrEqual(2e-6);
      }
    },
  );
});
