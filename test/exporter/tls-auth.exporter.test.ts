/**
 * The exporter process over TLS with basic authentication and client certificates, as a scraper on
 * another host meets it: a real daemon on a moving fake host, `vmsr-helper exporter
 * --web.config.file`, certificates made by openssl, and HTTPS clients with and without the right
 * password, certificate or scheme.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { METRIC } from '../../src/exporter/metrics.js';
import { WWW_AUTHENTICATE } from '../../src/exporter/basic-auth.js';
import { spawnHelper, tempDir, type DaemonChild } from '../daemon/support/daemon-process.js';
import { pollFor } from '../support/wait.js';
import { MovingHost, startDaemon, startExporterChild, type ExporterChild } from './support/stack.js';
import { makeTlsFiles, PASSWORD, PASSWORD_HASH, USER, type TlsFiles } from './support/tls-files.js';
import { get, statusOf, type GetOptions } from './support/https-get.js';

let files: TlsFiles;
let dir: string;
let host: MovingHost;
let daemon: DaemonChild;
let sock: string;
const children: ExporterChild[] = [];

beforeAll(async () => {
  dir = tempDir('vmsr-tls-');
  files = makeTlsFiles(dir);
  host = new MovingHost();
  host.pump(50);
  sock = path.join(dir, 'h.sock');
  daemon = await startDaemon(host, sock);
});

afterAll(async () => {
  for (const c of children) await c.stop();
  await daemon?.stop();
  host?.cleanup();
  fs.rmSync(dir, { recursive: true, force: true });
});

function webConfig(name: string, lines: string[]): string {
  const f = path.join(dir, name);
  fs.writeFileSync(f, `${lines.join('\n')}\n`);
  return f;
}

const TLS = (extra: string[] = []) => [
  'tls_server_config:',
  `  cert_file: ${files.serverCert}`,
  `  key_file: ${files.serverKey}`,
  ...extra,
];
const USERS = ['basic_auth_users:', `  ${USER}: ${PASSWORD_HASH}`];

async function exporter(args: string[]): Promise<ExporterChild> {
  const c = await startExporterChild(sock, args);
  children.push(c);
  return c;
}

/** Waits until `url` (with `o`) serves the host package series, and returns that body. */
async function waitForHostSeries(url: string, o: GetOptions): Promise<string> {
  return pollFor(
    async () => {
      const r = await get(url, o);
      return 'body' in r && r.body.includes(`${METRIC.packageEnergy}{package="0",domain="package"}`) ? r.body : undefined;
    },
    'the package series',
    () => children.map((c) => c.stderr()).join('\n'),
  );
}

/** Waits until `url` (with `o`) serves the helper's sample count, and returns that body. */
async function waitForHealth(url: string, o: GetOptions = {}): Promise<string> {
  return pollFor(
    async () => {
      const r = await get(url, o);
      return 'body' in r && /^vmsr_helper_samples_total \d+/m.test(r.body) ? r.body : undefined;
    },
    'the health series',
    () => children.map((c) => c.stderr()).join('\n'),
  );
}

describe('exporter over TLS with basic authentication', () => {
  test('the right password gets the metrics over HTTPS; a wrong or missing one gets 401 with WWW-Authenticate; plain HTTP is refused', async () => {
    const web = webConfig('tls-auth.yml', [...TLS(), ...USERS, 'http_server_config:', '  headers:', '    X-Content-Type-Options: nosniff']);
    const ex = await exporter(['--web.config.file', web]);
    expect(ex.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+\/metrics$/);
    const body = await waitForHostSeries(ex.url, { ca: files.caCert, auth: `${USER}:${PASSWORD}` });
    expect(body).toMatch(/^vmsr_exporter_helper_connected 1$/m);

    const right = await get(ex.url, { ca: files.caCert, auth: `${USER}:${PASSWORD}` });
    expect(statusOf(right)).toBe(200);
    expect('headers' in right && right.headers['x-content-type-options']).toBe('nosniff');
    for (const auth of [`${USER}:wrong`, `nobody:${PASSWORD}`, undefined]) {
      const r = await get(ex.url, { ca: files.caCert, ...(auth ? { auth } : {}) });
      expect(statusOf(r), String(auth)).toBe(401);
      expect('headers' in r && r.headers['www-authenticate']).toBe(WWW_AUTHENTICATE);
      expect('body' in r && r.body).not.toContain(METRIC.packageEnergy);
    }
    // Every path asks for the password, not only /metrics.
    expect(statusOf(await get(ex.url.replace('/metrics', '/'), { ca: files.caCert }))).toBe(401);
    // Plain HTTP to the TLS port: the handshake fails and the connection is closed, no answer.
    const plain = await get(ex.url.replace('https:', 'http:'), { auth: `${USER}:${PASSWORD}` });
    expect(plain).toHaveProperty('error');
    // A client that does not trust the certificate's CA refuses the server.
    expect(statusOf(await get(ex.url, { auth: `${USER}:${PASSWORD}` }))).toMatch(
      /UNABLE_TO_VERIFY_LEAF_SIGNATURE|SELF_SIGNED|UNABLE_TO_GET_ISSUER/,
    );
    // Still serving the right password afterwards.
    expect(statusOf(await get(ex.url, { ca: files.caCert, auth: `${USER}:${PASSWORD}` }))).toBe(200);
  });

  test('a client certificate is required and verified when client_ca_file is set; a stranger or a wrong SAN is refused', async () => {
    const web = webConfig('mtls.yml', TLS([`  client_ca_file: ${files.caCert}`]));
    const ex = await exporter(['--web.config.file', web]);
    const client = { ca: files.caCert, cert: files.clientCert, key: files.clientKey };
    await waitForHostSeries(ex.url, client);
    expect(statusOf(await get(ex.url, client))).toBe(200);
    expect(await get(ex.url, { ca: files.caCert })).toHaveProperty('error');
    expect(await get(ex.url, { ca: files.caCert, cert: files.strangerCert, key: files.strangerKey })).toHaveProperty('error');

    const sans = webConfig('mtls-sans.yml', TLS([`  client_ca_file: ${files.caCert}`, '  client_allowed_sans: [someone-else.test]']));
    const ex2 = await exporter(['--web.config.file', sans]);
    expect(await get(ex2.url, client)).toHaveProperty('error');
    fs.writeFileSync(sans, fs.readFileSync(sans, 'utf8').replace('someone-else.test', 'prometheus.test'));
    // Read again at the next connection: the client's SAN is now allowed.
    expect(statusOf(await get(ex2.url, client))).toBe(200);
  });

  test('RequireAnyClientCert wants a certificate from any CA; VerifyClientCertIfGiven lets none in but verifies one given', async () => {
    const client = { ca: files.caCert, cert: files.clientCert, key: files.clientKey };
    const stranger = { ca: files.caCert, cert: files.strangerCert, key: files.strangerKey };
    const any = await exporter(['--web.config.file', webConfig('any.yml', TLS(['  client_auth_type: RequireAnyClientCert']))]);
    await waitForHealth(any.url, client);
    expect(statusOf(await get(any.url, stranger))).toBe(200);
    expect(await get(any.url, { ca: files.caCert })).toHaveProperty('error');

    const ifGiven = await exporter([
      '--web.config.file',
      webConfig('if-given.yml', TLS([`  client_ca_file: ${files.caCert}`, '  client_auth_type: VerifyClientCertIfGiven'])),
    ]);
    await waitForHealth(ifGiven.url, client);
    expect(statusOf(await get(ifGiven.url, { ca: files.caCert }))).toBe(200);
    expect(await get(ifGiven.url, stranger)).toHaveProperty('error');
  });

  test('a new password in the file applies from the next request, without a restart', async () => {
    const web = webConfig('reload.yml', [...TLS(), 'basic_auth_users:', `  other: ${PASSWORD_HASH}`]);
    const ex = await exporter(['--web.config.file', web]);
    expect(statusOf(await get(ex.url, { ca: files.caCert, auth: `${USER}:${PASSWORD}` }))).toBe(401);
    webConfig('reload.yml', [...TLS(), ...USERS]);
    expect(statusOf(await get(ex.url, { ca: files.caCert, auth: `${USER}:${PASSWORD}` }))).toBe(200);
    expect(ex.stderr()).toContain('web configuration reloaded');
  });

  test('--host-series authenticated shows the package series to a password holder only; none shows them to nobody', async () => {
    const anonymous = await exporter(['--host-series', 'authenticated']);
    expect(anonymous.stderr()).toMatch(/--host-series authenticated without basic_auth_users or a verified client certificate/);
    const open = await waitForHealth(anonymous.url);
    expect(open).not.toContain(METRIC.packageEnergy);
    expect(open).not.toContain(METRIC.unattributedEnergy);

    const web = webConfig('host-series.yml', [...TLS(), ...USERS]);
    const authed = await exporter(['--web.config.file', web, '--host-series', 'authenticated']);
    await waitForHostSeries(authed.url, { ca: files.caCert, auth: `${USER}:${PASSWORD}` });

    const none = await exporter(['--web.config.file', web, '--host-series', 'none']);
    expect(await waitForHealth(none.url, { ca: files.caCert, auth: `${USER}:${PASSWORD}` })).not.toContain(METRIC.packageEnergy);
  });

  test('--listen :PORT serves on every address of the host', async () => {
    const ex = await exporter(['--listen', ':0']);
    const port = new URL(ex.url).port;
    for (const addr of ['127.0.0.1', '127.0.0.2', '[::1]']) {
      const r = await get(`http://${addr}:${port}/metrics`);
      if (addr === '[::1]' && 'error' in r && r.error === 'EADDRNOTAVAIL') continue; // no IPv6 loopback here
      expect(statusOf(r), addr).toBe(200);
    }
  });

  test('an exporter whose web configuration file is bad does not start, and says which key and the fix', async () => {
    const web = webConfig('bad.yml', [...TLS(['  client_auth_type: RequireClientCert'])]);
    const child = spawnHelper(['exporter', '-k', sock, '--listen', '127.0.0.1:0', '--web.config.file', web]);
    expect(await child.exited).not.toBe(0);
    expect(child.stderr()).toMatch(/client_auth_type: "RequireClientCert" is not known; use one of NoClientCert/);
  });
});
