/**
 * A local user who sends wrong passwords in a loop makes the exporter compute bcrypt hashes (about
 * 70 ms each at cost 10); the exporter computes at most MAX_CONCURRENT_VERIFICATIONS at once and
 * remembers Prometheus's right password, so the scrapes go on. The attacker is a real process (uid
 * nobody when the test runs as root) against the real exporter over TLS with basic auth.
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

/** Connections the attacker keeps sending wrong passwords on, each a new TLS connection per try. */
const ATTACKERS = 16;
const SCRAPES = 20;

/** Sends GET /metrics with a wrong password over TLS, n at a time, forever; prints "tries N" every second. */
const ATTACKER = `
const https = require('node:https');
const [port, n] = process.argv.slice(1).map(Number);
let tries = 0;
setInterval(() => process.stdout.write('tries ' + tries + '\\n'), 1000);
function one() {
  const req = https.get({ host: '127.0.0.1', port, path: '/metrics', rejectUnauthorized: false, agent: false,
    headers: { authorization: 'Basic ' + Buffer.from('prometheus:guess' + tries).toString('base64') } }, (res) => {
    res.resume();
    res.on('end', () => { tries++; one(); });
  });
  req.on('error', () => setTimeout(one, 10));
}
for (let i = 0; i < n; i++) one();
`;

describe('wrong passwords in a loop', () => {
  test('Prometheus scrapes with the right password succeed while another user floods wrong ones', async () => {
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
    const auth = `${USER}:${PASSWORD}`;
    expect(statusOf(await get(exporter.url, { ca: files.caCert, auth }))).toBe(200);

    const root = process.getuid?.() === 0;
    const attacker = spawn(process.execPath, ['-e', ATTACKER, new URL(exporter.url).port, String(ATTACKERS)], {
      stdio: ['ignore', 'pipe', 'inherit'],
      ...(root ? { uid: NOBODY, gid: NOBODY } : {}),
    });
    onCleanup(() => void attacker.kill('SIGKILL'));
    let out = '';
    attacker.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    await sleep(1_500);

    const results: (number | string)[] = [];
    const took: number[] = [];
    for (let i = 0; i < SCRAPES; i++) {
      const t0 = performance.now();
      results.push(statusOf(await get(exporter.url, { ca: files.caCert, auth })));
      took.push(performance.now() - t0);
      await sleep(100);
    }
    const tries = Math.max(0, ...[...out.matchAll(/tries (\d+)/g)].map((m) => Number(m[1])));
    // The attack really ran: wrong passwords were answered (401) all along, at bcrypt's pace.
    expect(tries, out).toBeGreaterThan(10);
    expect(results).toEqual(Array(SCRAPES).fill(200));
    // Generous on a shared 2-core machine with the attacker hashing on 2 threads: a remembered
    // password needs no hash, so a scrape stays far under Prometheus's default 10 s timeout.
    expect(Math.max(...took)).toBeLessThan(2_000);
  });
});
