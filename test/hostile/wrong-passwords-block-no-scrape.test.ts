/**
 * A local user who sends wrong passwords in a loop makes the exporter compute bcrypt hashes (about
 * 70 ms each at cost 10). Over 48 TLS keep-alive connections that made 20 of 33 right-password
 * scrapes fail ("closed without response": every connection slot held a request waiting for a
 * hash) and cost the exporter 7.7 s of CPU per 10 s; its memory grew from 71 to 127 MB. Now a
 * remembered password is answered before any queue, each source has a budget of failed checks
 * (then 429 without a hash), a wrong password closes its connection, and few checks wait. The
 * attacker is a real process (uid nobody when the test runs as root) against the real exporter
 * over TLS with basic auth; every scrape must be answered (200) within Prometheus's own scrape
 * timeout, 10 s: what a scrape that is too slow costs. Expected: tens of ms (printed); the issue's
 * 2 s was exceeded on a busy host (2 busy loops and other tests beside it) with nothing wrong.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { tempDir } from '../daemon/support/daemon-process.js';
import { startExporterChild } from '../exporter/support/stack.js';
import { get, statusOf } from '../exporter/support/https-get.js';
import { makeTlsFiles, PASSWORD, PASSWORD_HASH_COST10, USER } from '../exporter/support/tls-files.js';
import { NOBODY, onCleanup, sleep } from './support.js';

/** Keep-alive TLS connections the attacker sends wrong passwords on (reopened when the exporter closes one). */
const ATTACKERS = 48;
const SCRAPES = 30;
/**
 * Every right-password scrape within this: Prometheus's default scrape_timeout, past which its scrape
 * fails. Far above what is expected (tens of ms; the slowest is printed); before the defence, 20 of
 * 33 scrapes were not answered at all ("closed without response"), which `results` catches.
 */
const SCRAPE_WITHIN_MS = 10_000;
/** Above every scrape taking its whole bound, plus the attack's start: the bound judges, not the test's timeout. */
const TEST_TIMEOUT_MS = SCRAPES * (SCRAPE_WITHIN_MS + 200) + 60_000;

/** Sends GET /metrics with a wrong password on n keep-alive TLS connections, forever; prints "tries N statuses {...}" every second. */
const ATTACKER = `
const https = require('node:https');
const [port, n] = process.argv.slice(1).map(Number);
const agent = new https.Agent({ keepAlive: true, maxSockets: n, rejectUnauthorized: false });
let tries = 0;
const statuses = {};
setInterval(() => process.stdout.write('tries ' + tries + ' statuses ' + JSON.stringify(statuses) + '\\n'), 1000);
function one() {
  const req = https.get({ host: '127.0.0.1', port, path: '/metrics', agent,
    headers: { authorization: 'Basic ' + Buffer.from('prometheus:guess' + tries).toString('base64') } }, (res) => {
    statuses[res.statusCode] = (statuses[res.statusCode] || 0) + 1;
    res.resume();
    res.on('end', () => { tries++; one(); });
  });
  req.on('error', () => setTimeout(one, 10));
}
for (let i = 0; i < n; i++) one();
`;

/** user+system CPU seconds of `pid` so far (/proc/PID/stat fields 14 and 15, in clock ticks of 100 Hz). */
function cpuSeconds(pid: number): number {
  const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
}

function rssMb(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

describe('wrong passwords in a loop', () => {
  test(
    "every right-password scrape is answered within Prometheus's 10 s timeout while another user sends wrong ones over 48 TLS keep-alive connections, at a bounded cost",
    async () => {
      const dir = tempDir('vmsr-hostile-auth-');
      onCleanup(() => fs.rmSync(dir, { recursive: true, force: true }));
      const files = makeTlsFiles(dir);
      const web = path.join(dir, 'web.yml');
      fs.writeFileSync(
        web,
        `tls_server_config:\n  cert_file: ${files.serverCert}\n  key_file: ${files.serverKey}\nbasic_auth_users:\n  ${USER}: ${PASSWORD_HASH_COST10}\n`,
      );
      // No daemon: the exporter serves its own series (helper_connected 0), which is enough to scrape.
      const exporter = await startExporterChild(path.join(dir, 'absent.sock'), ['--web.config.file', web]);
      onCleanup(() => exporter.stop());
      const pid = exporter.proc.pid!;
      const auth = `${USER}:${PASSWORD}`;
      expect(statusOf(await get(exporter.url, { ca: files.caCert, auth }))).toBe(200);
      const rssBefore = rssMb(pid);

      const root = process.getuid?.() === 0;
      const attacker = spawn(process.execPath, ['-e', ATTACKER, new URL(exporter.url).port, String(ATTACKERS)], {
        stdio: ['ignore', 'pipe', 'inherit'],
        ...(root ? { uid: NOBODY, gid: NOBODY } : {}),
      });
      onCleanup(() => void attacker.kill('SIGKILL'));
      let out = '';
      attacker.stdout!.on('data', (d: Buffer) => (out += d.toString()));
      const attackStart = performance.now();
      await sleep(1_500);

      const lastTries = () => [...out.matchAll(/tries (\d+) statuses (\{[^}]*\})/g)].at(-1);
      const tries0 = Number(lastTries()?.[1] ?? 0);
      const cpu0 = cpuSeconds(pid);
      const wall0 = performance.now();
      const rss: number[] = [];
      const results: (number | string)[] = [];
      const took: number[] = [];
      for (let i = 0; i < SCRAPES; i++) {
        const t0 = performance.now();
        results.push(statusOf(await get(exporter.url, { ca: files.caCert, auth })));
        took.push(performance.now() - t0);
        rss.push(rssMb(pid));
        await sleep(200);
      }
      const cpuUsed = cpuSeconds(pid) - cpu0;
      const cpuShare = cpuUsed / ((performance.now() - wall0) / 1000);
      const attackS = (performance.now() - attackStart) / 1000;
      const rssAfter = rssMb(pid);
      const last = lastTries();
      const tries = last ? Number(last[1]) : 0;
      const checked = Number((JSON.parse(last?.[2] ?? '{}') as Record<string, number>)['401'] ?? 0);
      console.log(
        `attacker: ${tries} tries, ${last?.[2] ?? '{}'}; scrapes ${Math.max(...took).toFixed(0)} ms at most; exporter CPU ${(cpuShare * 100).toFixed(0)} % of a core; RSS ${rssBefore.toFixed(0)} -> ${rss.map((r) => r.toFixed(0)).join(' ')} MB`,
      );
      // The attack really ran: wrong passwords were answered (401, then 429 past the budget) all along.
      expect(tries, out).toBeGreaterThan(100);
      expect(last?.[2]).toMatch(/"429":/);
      expect(results).toEqual(Array(SCRAPES).fill(200));
      expect(
        took.filter((ms) => !(ms < SCRAPE_WITHIN_MS)),
        `scrapes slower than ${SCRAPE_WITHIN_MS} ms`,
      ).toEqual([]);
      // A wrong password costs the exporter a bcrypt hash only within the source's budget: 5, then one
      // a second; every other try is a 429 without a hash. (Its CPU share follows the attacker's request
      // rate, not bcrypt: printed above, not asserted, as it depends on how fast this machine lets the
      // attacker send.)
      expect(checked, 'wrong passwords checked with bcrypt').toBeLessThanOrEqual(5 + Math.ceil(attackS) + 1);
      // So each try costs the exporter far less than one bcrypt hash at cost 10 (tens of ms).
      expect(cpuUsed / Math.max(1, tries - tries0), "the exporter's CPU seconds per wrong try").toBeLessThan(0.005);
      // Memory stays bounded: garbage collected in a saw-tooth (104 to 124 MB over 40 s of this attack here), far
      // under the unit's MemoryMax=512M; the figures are printed above.
      expect(rssAfter).toBeLessThan(200);
    },
    TEST_TIMEOUT_MS,
  );
});
