/**
 * The web configuration file Prometheus exporters share (docs/exporter.md "Web configuration file"). What
 * Node's TLS cannot do as Go does is refused by name, never ignored.
 */
import path from 'node:path';
import { parseDocument } from 'yaml';
import { cannotError } from '../common/errors.js';

/** What the core schema gives: aliases resolve to copies, tags beyond it stay unresolved (refused). */
type YamlValue = string | number | boolean | null | YamlValue[] | { [key: string]: YamlValue };

/** Go's crypto/tls client authentication policies, as the file names them. */
const CLIENT_AUTH_TYPES = [
  'NoClientCert',
  'RequestClientCert',
  'RequireAnyClientCert',
  'VerifyClientCertIfGiven',
  'RequireAndVerifyClientCert',
] as const;

/** Go's TLS version names and Node's. */
const TLS_VERSIONS = { TLS10: 'TLSv1', TLS11: 'TLSv1.1', TLS12: 'TLSv1.2', TLS13: 'TLSv1.3' } as const;
type GoTlsVersion = keyof typeof TLS_VERSIONS;
type NodeTlsVersion = (typeof TLS_VERSIONS)[GoTlsVersion];

/** Go's cipher suite names (TLS 1.2 and below; Go does not let TLS 1.3 suites be chosen) and OpenSSL's. */
const CIPHER_SUITES: Record<string, string> = {
  TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256: 'ECDHE-ECDSA-AES128-GCM-SHA256',
  TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256: 'ECDHE-RSA-AES128-GCM-SHA256',
  TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384: 'ECDHE-ECDSA-AES256-GCM-SHA384',
  TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384: 'ECDHE-RSA-AES256-GCM-SHA384',
  TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256: 'ECDHE-ECDSA-CHACHA20-POLY1305',
  TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305: 'ECDHE-ECDSA-CHACHA20-POLY1305',
  TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256: 'ECDHE-RSA-CHACHA20-POLY1305',
  TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305: 'ECDHE-RSA-CHACHA20-POLY1305',
  TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA: 'ECDHE-ECDSA-AES128-SHA',
  TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA: 'ECDHE-RSA-AES128-SHA',
  TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA: 'ECDHE-ECDSA-AES256-SHA',
  TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA: 'ECDHE-RSA-AES256-SHA',
  TLS_RSA_WITH_AES_128_GCM_SHA256: 'AES128-GCM-SHA256',
  TLS_RSA_WITH_AES_256_GCM_SHA384: 'AES256-GCM-SHA384',
  TLS_RSA_WITH_AES_128_CBC_SHA: 'AES128-SHA',
  TLS_RSA_WITH_AES_256_CBC_SHA: 'AES256-SHA',
};

/** Go's curve names and OpenSSL's. */
const CURVES: Record<string, string> = { CurveP256: 'P-256', CurveP384: 'P-384', CurveP521: 'P-521', X25519: 'X25519' };

/** The response headers the file may set, and the values a header accepts (null: any one-line text). */
const HEADERS: Record<string, readonly string[] | null> = {
  'Content-Security-Policy': null,
  'X-Frame-Options': ['deny', 'sameorigin'],
  'X-Content-Type-Options': ['nosniff'],
  'X-XSS-Protection': null,
  'Strict-Transport-Security': null,
};

/** A bcrypt hash as htpasswd -B, Python's bcrypt and Go's x/crypto/bcrypt write it. */
const BCRYPT_HASH = /^\$2[aby]\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}$/;

/** PEM text, from the file itself (inline) or from a file it names (resolved against the file's folder). */
export type PemSource = { inline: string } | { file: string };

export type TlsServerConfig = NonNullable<ReturnType<typeof checkTls>>;
export type WebConfig = ReturnType<typeof parseWebConfig>;

type Doc = { [key: string]: YamlValue };

class Checker {
  constructor(
    private readonly source: string,
    private readonly dir: string,
  ) {}

  fail(key: string, why: string, fix: string): never {
    throw cannotError(`use ${this.source}`, `${key}: ${why}`, fix);
  }

  mapping(v: YamlValue | undefined, key: string, known: readonly string[]): Doc {
    if (v === null || v === undefined) return Object.create(null) as Doc;
    if (typeof v !== 'object' || Array.isArray(v)) this.fail(key, 'is not a mapping of keys to values', 'indent its keys below it');
    for (const k of Object.keys(v))
      if (!known.includes(k))
        this.fail(key === '' ? k : `${key}.${k}`, 'is not a key of the web configuration file', `use one of ${known.join(', ')}`);
    return v;
  }

  string(v: YamlValue | undefined, key: string): string | null {
    if (v === null || v === undefined || v === '') return null;
    if (typeof v !== 'string') this.fail(key, `${JSON.stringify(v)} is not text`, 'quote it');
    return v;
  }

  bool(v: YamlValue | undefined, key: string, dflt: boolean): boolean {
    if (v === null || v === undefined) return dflt;
    if (typeof v !== 'boolean') this.fail(key, `${JSON.stringify(v)} is not true or false`, 'write true or false');
    return v;
  }

  list(v: YamlValue | undefined, key: string): string[] {
    if (v === null || v === undefined) return [];
    if (!Array.isArray(v) || v.some((x) => typeof x !== 'string'))
      this.fail(key, 'is not a list of names', 'write one "- NAME" line per entry');
    return v as string[];
  }

  oneOf<T extends string>(v: string, key: string, allowed: readonly T[]): T {
    if (!(allowed as readonly string[]).includes(v))
      this.fail(key, `${JSON.stringify(v)} is not known`, `use one of ${allowed.join(', ')}`);
    return v as T;
  }

  /** `inlineKey` (PEM text) or `fileKey` (a path, relative to the file's folder), one of them. */
  pem(tls: Doc, inlineKey: string, fileKey: string, required: boolean): PemSource | null {
    const inline = this.string(tls[inlineKey], `tls_server_config.${inlineKey}`);
    const file = this.string(tls[fileKey], `tls_server_config.${fileKey}`);
    if (inline !== null && file !== null)
      this.fail(`tls_server_config.${inlineKey}`, `is given with ${fileKey}`, `keep one of ${inlineKey} and ${fileKey}`);
    if (inline !== null) return { inline };
    if (file !== null) return { file: path.resolve(this.dir, file) };
    if (required) this.fail(`tls_server_config.${fileKey}`, 'is missing', `name the PEM file (or give the PEM text as ${inlineKey})`);
    return null;
  }
}

function checkTls(c: Checker, v: YamlValue | undefined) {
  if (v === undefined || v === null) return null;
  const tls = c.mapping(v, 'tls_server_config', [
    'cert',
    'key',
    'client_ca',
    'cert_file',
    'key_file',
    'client_ca_file',
    'client_auth_type',
    'client_allowed_sans',
    'min_version',
    'max_version',
    'cipher_suites',
    'prefer_server_cipher_suites',
    'curve_preferences',
  ]);
  const cert = c.pem(tls, 'cert', 'cert_file', true)!;
  const key = c.pem(tls, 'key', 'key_file', true)!;
  const clientCa = c.pem(tls, 'client_ca', 'client_ca_file', false);
  const authText = c.string(tls.client_auth_type, 'tls_server_config.client_auth_type');
  // As the toolkit: a client CA without a policy means verify every client against it.
  const byDefault = clientCa !== null ? 'RequireAndVerifyClientCert' : 'NoClientCert';
  const clientAuthType = authText === null ? byDefault : c.oneOf(authText, 'tls_server_config.client_auth_type', CLIENT_AUTH_TYPES);
  const verifies = clientAuthType === 'VerifyClientCertIfGiven' || clientAuthType === 'RequireAndVerifyClientCert';
  if (verifies && clientCa === null)
    c.fail('tls_server_config.client_auth_type', `${clientAuthType} needs a CA to verify against`, 'set client_ca_file');
  if (!verifies && clientCa !== null && clientAuthType !== 'NoClientCert')
    c.fail('tls_server_config.client_ca_file', `is not used by ${clientAuthType}`, 'use RequireAndVerifyClientCert to verify clients');
  const clientAllowedSans = c.list(tls.client_allowed_sans, 'tls_server_config.client_allowed_sans');
  if (clientAllowedSans.length > 0 && clientAuthType !== 'RequireAnyClientCert' && clientAuthType !== 'RequireAndVerifyClientCert')
    c.fail(
      'tls_server_config.client_allowed_sans',
      `needs a certificate from every client, and ${clientAuthType} does not ask for one`,
      'set client_auth_type: RequireAndVerifyClientCert',
    );
  const version = (k: 'min_version' | 'max_version', dflt: GoTlsVersion): NodeTlsVersion => {
    const t = c.string(tls[k], `tls_server_config.${k}`);
    return TLS_VERSIONS[t === null ? dflt : c.oneOf(t, `tls_server_config.${k}`, Object.keys(TLS_VERSIONS) as GoTlsVersion[])];
  };
  const minVersion = version('min_version', 'TLS12');
  const maxVersion = version('max_version', 'TLS13');
  if (minVersion > maxVersion) c.fail('tls_server_config.min_version', `${minVersion} is above max_version ${maxVersion}`, 'swap them');
  const names = (k: string, table: Record<string, string>): string | null => {
    const list = c.list(tls[k], `tls_server_config.${k}`);
    if (list.length === 0) return null;
    return list.map((n) => table[c.oneOf(n, `tls_server_config.${k}`, Object.keys(table))]).join(':');
  };
  return {
    cert,
    key,
    clientCa,
    clientAuthType,
    /** Subject alternative names a client certificate must carry one of (empty: any). */
    clientAllowedSans,
    minVersion,
    maxVersion,
    /** OpenSSL's cipher and curve lists, or null for Node's defaults. */
    ciphers: names('cipher_suites', CIPHER_SUITES),
    honorCipherOrder: c.bool(tls.prefer_server_cipher_suites, 'tls_server_config.prefer_server_cipher_suites', true),
    ecdhCurve: names('curve_preferences', CURVES),
  };
}

function checkUsers(c: Checker, v: YamlValue | undefined): Map<string, string> {
  const users = new Map<string, string>();
  if (v === undefined || v === null) return users;
  if (typeof v !== 'object' || Array.isArray(v))
    c.fail('basic_auth_users', 'is not a mapping of user names to bcrypt hashes', 'write "user: HASH" lines below it');
  for (const [user, hash] of Object.entries(v)) {
    const key = `basic_auth_users.${user}`;
    if (user === '' || user.includes(':') || /[\x00-\x1f\x7f]/.test(user))
      c.fail(key, 'a user name may not be empty or hold ":" or control characters', 'rename the user');
    if (typeof hash !== 'string' || !BCRYPT_HASH.test(hash))
      c.fail(key, 'is not a bcrypt hash ($2y$COST$ and 53 characters)', 'make one with: vmsr-helper hash-password');
    users.set(user, hash);
  }
  return users;
}

function checkHttp(c: Checker, v: YamlValue | undefined): Record<string, string> {
  const http = c.mapping(v, 'http_server_config', ['http2', 'headers']);
  // HTTP/2 is Go's default; the exporter speaks HTTP/1.1 (TLS offers only http/1.1), which every scraper speaks.
  c.bool(http.http2, 'http_server_config.http2', true);
  const headers = c.mapping(http.headers, 'http_server_config.headers', Object.keys(HEADERS));
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    const key = `http_server_config.headers.${name}`;
    const text = c.string(value, key);
    if (text === null) continue;
    if (/[\x00-\x1f\x7f]/.test(text)) c.fail(key, 'holds a control character', 'write the value on one line');
    const allowed = HEADERS[name];
    out[name] = allowed ? c.oneOf(text.toLowerCase(), key, allowed) : text;
  }
  return out;
}

/** The YAML text as data, or an error with the line of the first thing the parser reports. */
function parseYaml(text: string, source: string): YamlValue {
  const doc = parseDocument(text, { version: '1.2', schema: 'core', uniqueKeys: true, resolveKnownTags: false, logLevel: 'error' });
  const problem = doc.errors[0] ?? doc.warnings[0];
  if (problem !== undefined) {
    const why = problem.message.replace(/ at line \d+, column \d+:?\n[\s\S]*$/, '');
    const line = problem.linePos?.[0].line ?? 1;
    throw cannotError(`read ${source}`, `line ${line}: ${why}`, 'write it as YAML (see docs/exporter.md "Web configuration file")');
  }
  return doc.toJS({ maxAliasCount: 100 }) as YamlValue;
}

/** Parses and checks a web configuration file's text; `source` names it in errors, `dir` resolves its relative paths. */
export function parseWebConfig(text: string, source: string, dir: string) {
  const c = new Checker(source, dir);
  const doc = parseYaml(text, source);
  const top = c.mapping(doc, '', ['tls_server_config', 'http_server_config', 'basic_auth_users', 'rate_limit']);
  if (top.rate_limit !== undefined)
    c.fail(
      'rate_limit',
      'is not supported by this exporter',
      'remove it: the exporter bounds its connections and their timeouts itself (docs/exporter.md)',
    );
  return {
    tls: checkTls(c, top.tls_server_config),
    /** User name to bcrypt hash; empty: no basic authentication. */
    basicAuthUsers: checkUsers(c, top.basic_auth_users),
    headers: checkHttp(c, top.http_server_config),
  };
}

/** Whether a request must prove who it is (a password, or a verified client certificate). */
export function requiresAuthentication(w: WebConfig): boolean {
  return w.basicAuthUsers.size > 0 || w.tls?.clientAuthType === 'RequireAndVerifyClientCert';
}
