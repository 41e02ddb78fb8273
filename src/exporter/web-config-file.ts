/**
 * The --web.config.file on disk, loaded again on a new connection when it or a file it names changed;
 * a change that does not load is logged and the last good configuration stays.
 */
import fs from 'node:fs';
import path from 'node:path';
import tls from 'node:tls';
import { cannotError } from '../common/errors.js';
import { parseWebConfig, type PemSource, type TlsServerConfig, type WebConfig } from './web-config.js';
import type { LogSink } from '../logging/logger.js';

/** The web configuration file and each PEM file it names may hold this much. */
const MAX_WEB_CONFIG_FILE_BYTES = 1024 * 1024;

export interface LoadedWebConfig {
  config: WebConfig;
  /** The server's TLS options (certificate, key, the CA that verifies clients, versions, ciphers), checked; null without tls_server_config. */
  tlsOptions: tls.TlsOptions | null;
}

function readBounded(file: string, what: string): string {
  let fd: number;
  try {
    fd = fs.openSync(file, 'r');
  } catch (e) {
    throw cannotError(
      `read ${what} ${file}`,
      (e as NodeJS.ErrnoException).code ?? (e as Error).message,
      'check the path and its permissions',
    );
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw cannotError(`read ${what} ${file}`, 'not a regular file', 'name a file');
    if (st.size > MAX_WEB_CONFIG_FILE_BYTES)
      throw cannotError(`read ${what} ${file}`, `${st.size} bytes, over ${MAX_WEB_CONFIG_FILE_BYTES}`, 'name the right file');
    const buf = Buffer.alloc(st.size);
    const n = fs.readSync(fd, buf, 0, st.size, 0);
    return buf.subarray(0, n).toString('utf8');
  } finally {
    fs.closeSync(fd);
  }
}

function pemText(src: PemSource, key: string): string {
  return 'inline' in src ? src.inline : readBounded(src.file, `tls_server_config.${key}`);
}

function tlsOptionsOf(t: TlsServerConfig, source: string): tls.TlsOptions {
  const options: tls.TlsOptions = {
    cert: pemText(t.cert, 'cert_file'),
    key: pemText(t.key, 'key_file'),
    ...(t.clientCa === null ? {} : { ca: pemText(t.clientCa, 'client_ca_file') }),
    minVersion: t.minVersion,
    maxVersion: t.maxVersion,
    honorCipherOrder: t.honorCipherOrder,
    ...(t.ciphers === null ? {} : { ciphers: t.ciphers }),
    ...(t.ecdhCurve === null ? {} : { ecdhCurve: t.ecdhCurve }),
    // Go's policies in OpenSSL's terms; what OpenSSL does not check is checked after the handshake (http-server.ts).
    requestCert: t.clientAuthType !== 'NoClientCert',
    rejectUnauthorized: t.clientAuthType === 'RequireAndVerifyClientCert',
  };
  try {
    // Made once here so that a key that is not the certificate's fails the load, not each handshake.
    tls.createSecureContext(options);
    return options;
  } catch (e) {
    throw cannotError(
      `use ${source}`,
      `tls_server_config: ${(e as Error).message}`,
      "check that cert_file and key_file are PEM, that the key is the certificate's, and that client_ca_file is a PEM CA certificate",
    );
  }
}

/** Reads, checks and loads `file` now; throws naming the key and the fix. */
export function loadWebConfigFile(file: string): LoadedWebConfig {
  const config = parseWebConfig(readBounded(file, 'the web configuration file'), file, path.dirname(path.resolve(file)));
  return { config, tlsOptions: config.tls === null ? null : tlsOptionsOf(config.tls, file) };
}

/** What identifies a file's content without reading it. */
function signature(file: string): string {
  try {
    const st = fs.statSync(file, { bigint: true });
    return `${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}`;
  } catch (e) {
    return `missing:${(e as NodeJS.ErrnoException).code ?? ''}`;
  }
}

/** The signatures of `file` and of the PEM files its configuration `c` names. */
function signaturesOf(file: string, c: WebConfig): string {
  const files = [file];
  for (const src of [c.tls?.cert, c.tls?.key, c.tls?.clientCa]) if (src && 'file' in src) files.push(src.file);
  return files.map(signature).join('|');
}

/** The file as it is now; checked on each connection, loaded again when it or a file it names changed. */
export class WebConfigFile {
  private loaded: LoadedWebConfig;
  private signatures: string;
  /** The signatures of a change that failed, so that it is logged once. */
  private failedSignatures: string | null = null;

  constructor(
    readonly file: string,
    private readonly log: LogSink<'info' | 'error'>,
  ) {
    this.loaded = loadWebConfigFile(file);
    this.signatures = signaturesOf(file, this.loaded.config);
  }

  current(): LoadedWebConfig {
    const now = signaturesOf(this.file, this.loaded.config);
    if (now === this.signatures || now === this.failedSignatures) return this.loaded;
    try {
      const next = loadWebConfigFile(this.file);
      if ((next.config.tls === null) !== (this.loaded.config.tls === null))
        throw cannotError(
          `apply ${this.file}`,
          `it turns TLS ${next.config.tls === null ? 'off' : 'on'} and the listening socket cannot change its kind`,
          'restart the exporter',
        );
      this.loaded = next;
      this.signatures = signaturesOf(this.file, next.config);
      this.failedSignatures = null;
      this.log.info({ file: this.file }, 'web configuration reloaded');
    } catch (e) {
      this.failedSignatures = now;
      this.log.error(
        { file: this.file, err: (e as Error).message },
        'web configuration changed but does not load: the previous one stays in force',
      );
    }
    return this.loaded;
  }
}
