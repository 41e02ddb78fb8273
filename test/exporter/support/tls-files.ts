/**
 * Real certificates for the TLS tests, made by openssl: a CA, a server certificate for loopback
 * addresses and localhost, a client certificate the CA signed, and one from a CA nobody trusts.
 * Also a user whose bcrypt hash is a published test vector, so no hashing tool is needed.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

export interface TlsFiles {
  dir: string;
  caCert: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
  /** A client certificate from a CA the server does not trust. */
  strangerCert: string;
  strangerKey: string;
}

/** The user and password the test web configurations accept: "abc" is jBCrypt's published vector. */
export const USER = 'prometheus';
export const PASSWORD = 'abc';
export const PASSWORD_HASH = '$2a$06$If6bvum7DFjUnE9p2uDeDu0YHzrHM6tf.iqN8.yx.jNN1ILEf7h0i';
/** The same password at cost 10 (about 70 ms a check), made by libxcrypt as htpasswd -B would. */
export const PASSWORD_HASH_COST10 = '$2b$10$x/7QwwgVMbWcrnuKet1pJe5JAhU2XlkdyR9fm05A19T2d27M0EF2O';

function openssl(dir: string, args: string[]): void {
  execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
}

function signed(dir: string, name: string, ca: string, subj: string, san: string): void {
  openssl(dir, [
    'req',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:P-256',
    '-nodes',
    '-keyout',
    `${name}.key`,
    '-out',
    `${name}.csr`,
    '-subj',
    subj,
  ]);
  fs.writeFileSync(path.join(dir, `${name}.ext`), `subjectAltName=${san}\n`);
  openssl(dir, [
    'x509',
    '-req',
    '-in',
    `${name}.csr`,
    '-CA',
    `${ca}.crt`,
    '-CAkey',
    `${ca}.key`,
    '-CAcreateserial',
    '-out',
    `${name}.crt`,
    '-days',
    '2',
    '-extfile',
    `${name}.ext`,
  ]);
}

function ca(dir: string, name: string): void {
  openssl(dir, [
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:P-256',
    '-nodes',
    '-keyout',
    `${name}.key`,
    '-out',
    `${name}.crt`,
    '-days',
    '2',
    '-subj',
    `/CN=${name}`,
  ]);
}

/** Makes the files in `dir` (which must exist). */
export function makeTlsFiles(dir: string): TlsFiles {
  ca(dir, 'ca');
  ca(dir, 'stranger-ca');
  const ips = Array.from({ length: 8 }, (_, i) => `IP:127.0.0.${i + 1}`).join(',');
  signed(dir, 'server', 'ca', '/CN=vmsr-exporter', `${ips},IP:::1,DNS:localhost`);
  signed(dir, 'client', 'ca', '/CN=prometheus', 'DNS:prometheus.test');
  signed(dir, 'stranger', 'stranger-ca', '/CN=stranger', 'DNS:prometheus.test');
  const f = (n: string): string => path.join(dir, n);
  return {
    dir,
    caCert: f('ca.crt'),
    serverCert: f('server.crt'),
    serverKey: f('server.key'),
    clientCert: f('client.crt'),
    clientKey: f('client.key'),
    strangerCert: f('stranger.crt'),
    strangerKey: f('stranger.key'),
  };
}
