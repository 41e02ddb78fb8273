/** One GET on a connection of its own, over TLS or not, with basic auth and a client certificate if given. */
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';

export interface GetOptions {
  /** PEM file of the CA that signed the server's certificate. */
  ca?: string;
  /** user:password for basic authentication. */
  auth?: string;
  cert?: string;
  key?: string;
  accept?: string;
}

export type GetResult = { status: number; headers: http.IncomingHttpHeaders; body: string } | { error: string };

export function get(url: string, o: GetOptions = {}): Promise<GetResult> {
  const u = new URL(url);
  const mod = u.protocol === 'https:' ? https : http;
  return new Promise((resolve) => {
    const req = mod.get(
      url,
      {
        agent: false,
        timeout: 10_000,
        ...(o.ca ? { ca: fs.readFileSync(o.ca) } : {}),
        ...(o.cert ? { cert: fs.readFileSync(o.cert) } : {}),
        ...(o.key ? { key: fs.readFileSync(o.key) } : {}),
        headers: {
          ...(o.auth ? { authorization: `Basic ${Buffer.from(o.auth).toString('base64')}` } : {}),
          ...(o.accept ? { accept: o.accept } : {}),
        },
      },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (body += d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
        res.on('error', (e: NodeJS.ErrnoException) => resolve({ error: e.code ?? e.message }));
      },
    );
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', (e: NodeJS.ErrnoException) => resolve({ error: e.code ?? e.message }));
  });
}

/** The status of a result, or its error. */
export function statusOf(r: GetResult): number | string {
  return 'error' in r ? r.error : r.status;
}
