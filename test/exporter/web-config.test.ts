import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parseWebConfig, requiresAuthentication } from '../../src/exporter/web-config.js';
import { loadWebConfigFile, WebConfigFile } from '../../src/exporter/web-config-file.js';
import { tempDir } from '../daemon/support/daemon-process.js';
import { makeTlsFiles, PASSWORD_HASH, type TlsFiles } from './support/tls-files.js';

const check = (yaml: string, dir = '/etc/vmsr') => parseWebConfig(yaml, 'web.yml', dir);

let files: TlsFiles;
beforeAll(() => {
  files = makeTlsFiles(tempDir('vmsr-webcfg-'));
});
afterAll(() => fs.rmSync(files.dir, { recursive: true, force: true }));

describe('web configuration: what it means', () => {
  test('an exporter toolkit file with TLS and bcrypt users reads unchanged, paths relative to its folder', () => {
    const c = check(
      [
        '# TLS and basic authentication configuration example.',
        'tls_server_config:',
        '  cert_file: server.crt',
        '  key_file: server.key',
        'basic_auth_users:',
        '  alice: $2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze',
        '  bob: $2y$10$hLqFl9jSjoAAy95Z/zw8Ye8wkdMBM8c5Bn1ptYqP/AXyV0.oy0S8m',
      ].join('\n'),
    );
    expect(c.tls).toMatchObject({
      cert: { file: '/etc/vmsr/server.crt' },
      key: { file: '/etc/vmsr/server.key' },
      clientCa: null,
      clientAuthType: 'NoClientCert',
      minVersion: 'TLSv1.2',
      maxVersion: 'TLSv1.3',
      ciphers: null,
      honorCipherOrder: true,
    });
    expect([...c.basicAuthUsers.keys()]).toEqual(['alice', 'bob']);
    expect(requiresAuthentication(c)).toBe(true);
  });

  test('client_ca_file alone means RequireAndVerifyClientCert, as in the toolkit', () => {
    const c = check('tls_server_config:\n  cert_file: /a.crt\n  key_file: /a.key\n  client_ca_file: ca.crt\n');
    expect(c.tls?.clientAuthType).toBe('RequireAndVerifyClientCert');
    expect(c.tls?.clientCa).toEqual({ file: '/etc/vmsr/ca.crt' });
    expect(requiresAuthentication(c)).toBe(true);
  });

  test('Go cipher suite and curve names become OpenSSL names, versions become Node names, headers are kept', () => {
    const c = check(
      [
        'tls_server_config:',
        '  cert_file: /a.crt',
        '  key_file: /a.key',
        '  min_version: TLS13',
        '  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305]',
        '  curve_preferences: [X25519, CurveP384]',
        '  prefer_server_cipher_suites: false',
        'http_server_config:',
        '  http2: false',
        '  headers:',
        '    X-Frame-Options: DENY',
        '    Strict-Transport-Security: max-age=31536000',
      ].join('\n'),
    );
    expect(c.tls).toMatchObject({
      minVersion: 'TLSv1.3',
      ciphers: 'ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305',
      ecdhCurve: 'X25519:P-384',
      honorCipherOrder: false,
    });
    expect(c.headers).toEqual({ 'X-Frame-Options': 'deny', 'Strict-Transport-Security': 'max-age=31536000' });
    expect(requiresAuthentication(c)).toBe(false);
  });

  test('an empty file is plain HTTP without authentication', () => {
    const c = check('');
    expect(c.tls).toBeNull();
    expect(c.basicAuthUsers.size).toBe(0);
  });

  test('a bad file is refused naming the key, why, and the fix', () => {
    const tls = 'tls_server_config:\n  cert_file: /a.crt\n  key_file: /a.key\n';
    const cases: [string, RegExp][] = [
      [
        'tls_config:\n  cert_file: x',
        /cannot use web\.yml: tls_config: is not a key of the web configuration file; use one of tls_server_config/,
      ],
      [`${tls}  client_auth: x`, /tls_server_config\.client_auth: is not a key/],
      ['tls_server_config:\n  key_file: /a.key', /tls_server_config\.cert_file: is missing; name the PEM file/],
      [`${tls}  cert: inline`, /tls_server_config\.cert: is given with cert_file; keep one/],
      [`${tls}  client_auth_type: RequireClientCert`, /client_auth_type: "RequireClientCert" is not known; use one of NoClientCert, /],
      [`${tls}  client_auth_type: RequireAndVerifyClientCert`, /needs a CA to verify against; set client_ca_file/],
      [`${tls}  client_auth_type: RequestClientCert\n  client_ca_file: /ca`, /client_ca_file: is not used by RequestClientCert/],
      [`${tls}  client_allowed_sans: [a]`, /client_allowed_sans: needs a certificate from every client/],
      [`${tls}  min_version: TLS14`, /min_version: "TLS14" is not known; use one of TLS10, TLS11, TLS12, TLS13/],
      [`${tls}  min_version: TLS13\n  max_version: TLS12`, /min_version: TLSv1\.3 is above max_version/],
      [`${tls}  cipher_suites: [TLS_AES_128_GCM_SHA256]`, /cipher_suites: "TLS_AES_128_GCM_SHA256" is not known/],
      [`${tls}  curve_preferences: [X25519MLKEM768]`, /curve_preferences: "X25519MLKEM768" is not known/],
      [`${tls}  prefer_server_cipher_suites: yes`, /prefer_server_cipher_suites: "yes" is not true or false/],
      ['basic_auth_users:\n  alice: secret', /basic_auth_users\.alice: is not a bcrypt hash.*vmsr-helper hash-password/],
      [`basic_auth_users:\n  "a:b": ${PASSWORD_HASH}`, /basic_auth_users\.a:b: a user name may not be empty or hold ":"/],
      ['basic_auth_users: [a]', /basic_auth_users: is not a mapping/],
      ['http_server_config:\n  headers:\n    Server: x', /headers\.Server: is not a key.*use one of Content-Security-Policy/],
      ['http_server_config:\n  headers:\n    X-Frame-Options: allow', /X-Frame-Options: "allow" is not known; use one of deny, sameorigin/],
      ['rate_limit:\n  burst: 20', /rate_limit: is not supported by this exporter; remove it/],
      ['- a', /: is not a mapping of keys to values/],
    ];
    for (const [text, why] of cases) expect(() => check(text), text).toThrow(why);
  });
});

describe('web configuration: the file as YAML', () => {
  const HASH = '$2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze';

  test('comments, quoted and plain scalars, block and flow lists, --- and an inline PEM block read as YAML 1.2 does', () => {
    const pem = '-----BEGIN CERTIFICATE-----\nMIIB # not a comment\n-----END CERTIFICATE-----';
    const c = check(
      [
        '---',
        '# a comment',
        'tls_server_config:',
        '  cert: |',
        ...pem.split('\n').map((l) => `    ${l}`),
        "  key_file: '/etc/vmsr/it''s.key'   # trailing comment",
        '  min_version: "TLS12"',
        '  prefer_server_cipher_suites: false',
        '  cipher_suites:',
        '    - TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256',
        '    - "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"',
        '  curve_preferences: [X25519, "CurveP256"]',
        'basic_auth_users:',
        `  "bob smith": ${HASH}`,
        'http_server_config:',
        '  headers:',
        '    Content-Security-Policy: "default-src \\u0027none\\u0027"',
        '    X-XSS-Protection: ~',
      ].join('\n'),
    );
    expect(c.tls).toMatchObject({
      cert: { inline: `${pem}\n` },
      key: { file: "/etc/vmsr/it's.key" },
      minVersion: 'TLSv1.2',
      honorCipherOrder: false,
      ciphers: 'ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384',
      ecdhCurve: 'X25519:P-256',
    });
    expect([...c.basicAuthUsers]).toEqual([['bob smith', HASH]]);
    expect(c.headers).toEqual({ 'Content-Security-Policy': "default-src 'none'" });
    expect(check('---\n# nothing\n').tls).toBeNull();
  });

  test('an alias reads as a copy of its anchor', () => {
    const c = check(`basic_auth_users:\n  alice: &h ${HASH}\n  bob: *h\n`);
    expect([...c.basicAuthUsers.values()]).toEqual([HASH, HASH]);
  });

  test('text that is not one clean YAML document is refused with its line number and a fix', () => {
    const cases: [string, RegExp][] = [
      [`basic_auth_users:\n  a: ${HASH}\n  a: ${HASH}`, /line 3: Map keys must be unique/],
      ['tls_server_config:\n\tcert_file: x', /line 2: Tabs are not allowed/],
      ['basic_auth_users: !!binary aGVsbG8=', /line 1: .*tag/i],
      ['tls_server_config: cert_file: x', /line 1: Nested mappings are not allowed/],
      ['http_server_config:\n  headers:\n    X-XSS-Protection: "open', /line 3: .*quote/i],
      ['http_server_config: {}\n---\nbasic_auth_users: {}', /line 2: Source contains multiple documents/],
      ['http_server_config:\n  headers:\n    X-XSS-Protection: "\\q"', /line 3: Invalid escape sequence/],
    ];
    for (const [text, why] of cases) {
      expect(() => check(text), text).toThrow(why);
      expect(() => check(text), text).toThrow(/^cannot read web\.yml: line \d+: .*; write it as YAML/);
    }
  });

  test('a key named __proto__ is data: refused as an unknown key, no prototype touched', () => {
    expect(() => check('__proto__:\n  polluted: 1\n')).toThrow(/__proto__: is not a key of the web configuration file/);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    const c = check(`basic_auth_users:\n  __proto__: ${HASH}\n`);
    expect([...c.basicAuthUsers.keys()]).toEqual(['__proto__']);
  });
});

describe('web configuration file: load and reload', () => {
  const write = (dir: string, text: string): string => {
    const f = path.join(dir, 'web.yml');
    fs.writeFileSync(f, text);
    return f;
  };

  test('a file naming real PEM files loads a TLS context; a wrong key names the fix', () => {
    const dir = tempDir('vmsr-webcfg-load-');
    try {
      fs.copyFileSync(files.serverCert, path.join(dir, 'server.crt'));
      fs.copyFileSync(files.serverKey, path.join(dir, 'server.key'));
      const f = write(dir, 'tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n');
      expect(loadWebConfigFile(f).tlsOptions).not.toBeNull();
      fs.copyFileSync(files.clientKey, path.join(dir, 'server.key'));
      expect(() => loadWebConfigFile(f)).toThrow(/cannot use .*web\.yml: tls_server_config: .*; check that cert_file and key_file are PEM/);
      fs.rmSync(path.join(dir, 'server.key'));
      expect(() => loadWebConfigFile(f)).toThrow(/cannot read tls_server_config\.key_file .*server\.key: ENOENT; check the path/);
      expect(() => loadWebConfigFile(path.join(dir, 'absent.yml'))).toThrow(/cannot read the web configuration file .*absent\.yml: ENOENT/);
      expect(() => loadWebConfigFile(dir)).toThrow(/not a regular file/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('a changed file applies at the next look; a broken change is logged once and the last good one stays', () => {
    const dir = tempDir('vmsr-webcfg-reload-');
    const logs: string[] = [];
    const log = {
      info: (_o: object, m: string) => logs.push(`info ${m}`),
      error: (o: object, m: string) => logs.push(`error ${m} ${JSON.stringify(o)}`),
    };
    try {
      const f = write(dir, `basic_auth_users:\n  alice: ${PASSWORD_HASH}\n`);
      const w = new WebConfigFile(f, log);
      expect([...w.current().config.basicAuthUsers.keys()]).toEqual(['alice']);
      write(dir, `basic_auth_users:\n  bob: ${PASSWORD_HASH}\n# longer now, so the size changes\n`);
      expect([...w.current().config.basicAuthUsers.keys()]).toEqual(['bob']);
      expect(logs).toEqual(['info web configuration reloaded']);
      write(dir, 'basic_auth_users:\n  bob: not-a-hash\n');
      expect([...w.current().config.basicAuthUsers.keys()]).toEqual(['bob']);
      expect([...w.current().config.basicAuthUsers.keys()]).toEqual(['bob']);
      expect(logs).toHaveLength(2);
      expect(logs[1]).toMatch(/^error web configuration changed but does not load.*basic_auth_users\.bob: is not a bcrypt hash/);
      fs.copyFileSync(files.serverCert, path.join(dir, 's.crt'));
      fs.copyFileSync(files.serverKey, path.join(dir, 's.key'));
      write(dir, 'tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n');
      expect(w.current().config.tls).toBeNull();
      expect(logs[2]).toMatch(/it turns TLS on and the listening socket cannot change its kind; restart the exporter/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
