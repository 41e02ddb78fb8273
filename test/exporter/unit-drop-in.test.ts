/**
 * contrib/systemd/vmsr-helper-exporter.service.d/listen-tls.conf and exporter-web-config.yml: the
 * documented way to open the exporter to other hosts. systemd accepts the unit with the drop-in,
 * the drop-in replaces ExecStart with TLS from the credentials directory, and the example web
 * configuration refuses to load until its placeholder is a bcrypt hash, then loads with real files.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { BIN, ROOT, ensureBuilt, tempDir } from '../daemon/support/daemon-process.js';
import { loadWebConfigFile } from '../../src/exporter/web-config-file.js';
import { parseListenAddress } from '../../src/exporter/listen-address.js';
import { missing } from '../support/env.js';
import { makeTlsFiles, PASSWORD_HASH } from './support/tls-files.js';

const SYSTEMD = path.join(ROOT, 'contrib/systemd');
const UNIT = 'vmsr-helper-exporter.service';
const DROP_IN = path.join(SYSTEMD, `${UNIT}.d`, 'listen-tls.conf');
const EXAMPLE = path.join(SYSTEMD, 'exporter-web-config.yml');

let dir: string | null = null;
afterEach(() => {
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
  dir = null;
});

describe('the drop-in that opens the exporter with TLS', () => {
  const text = fs.readFileSync(DROP_IN, 'utf8');

  test('it resets ExecStart to listen on every address with the web configuration from the credentials directory', () => {
    const execs = text.split('\n').filter((l) => l.startsWith('ExecStart='));
    expect(execs[0]).toBe('ExecStart=');
    const m = /--listen (\S+) --web\.config\.file %d\/web-config\.yml$/.exec(execs[1]!);
    expect(m).not.toBeNull();
    expect(parseListenAddress(m![1]!).host).toBeNull();
    for (const f of ['web-config.yml', 'server.crt', 'server.key'])
      expect(text).toMatch(new RegExp(`^LoadCredential=${f.replace('.', '\\.')}:/`, 'm'));
    // The unit's own default stays loopback only.
    expect(fs.readFileSync(path.join(SYSTEMD, UNIT), 'utf8')).toMatch(/--listen 127\.0\.0\.1:8677$/m);
  });

  test('systemd-analyze verify accepts the unit with the drop-in', (ctx) => {
    const why = missing({ command: 'systemd-analyze' });
    if (why) return ctx.skip(why);
    ensureBuilt();
    dir = tempDir('vmsr-exporter-drop-in-');
    const exec = (t: string) => t.replace(/^ExecStart=vmsr-helper /m, `ExecStart=${process.execPath} ${BIN} `);
    fs.writeFileSync(path.join(dir, UNIT), exec(fs.readFileSync(path.join(SYSTEMD, UNIT), 'utf8')));
    fs.mkdirSync(path.join(dir, `${UNIT}.d`));
    fs.writeFileSync(path.join(dir, `${UNIT}.d`, 'listen-tls.conf'), exec(text));
    fs.copyFileSync(path.join(SYSTEMD, 'qemu-vmsr-helper.socket'), path.join(dir, 'qemu-vmsr-helper.socket'));
    // SYSTEMD_UNIT_PATH makes verify read the drop-in directory beside the unit.
    const verify = () =>
      execFileSync('sh', ['-c', `SYSTEMD_UNIT_PATH=${dir}: systemd-analyze verify ${dir}/${UNIT} 2>&1; echo "rc=$?"`], {
        encoding: 'utf8',
      }).trim();
    expect(verify()).toBe('rc=0');
    // The control: a key systemd does not know, added to the drop-in, is reported, so the drop-in was read.
    fs.appendFileSync(path.join(dir, `${UNIT}.d`, 'listen-tls.conf'), 'NoSuchKey=1\n');
    expect(verify()).toMatch(/listen-tls\.conf:\d+: Unknown key 'NoSuchKey'/);
  });

  test('the example web configuration refuses its placeholder, then loads with a hash and real certificate files', () => {
    dir = tempDir('vmsr-exporter-example-');
    const files = makeTlsFiles(dir);
    fs.copyFileSync(files.serverCert, path.join(dir, 'server.crt'));
    fs.copyFileSync(files.serverKey, path.join(dir, 'server.key'));
    const example = fs.readFileSync(EXAMPLE, 'utf8');
    const f = path.join(dir, 'web-config.yml');
    fs.writeFileSync(f, example);
    expect(() => loadWebConfigFile(f)).toThrow(/basic_auth_users\.prometheus: is not a bcrypt hash.*vmsr-helper hash-password/);
    fs.writeFileSync(f, example.replace('REPLACE-WITH-A-BCRYPT-HASH', PASSWORD_HASH));
    const loaded = loadWebConfigFile(f);
    expect(loaded.tlsOptions).not.toBeNull();
    expect(loaded.config.basicAuthUsers.get('prometheus')).toBe(PASSWORD_HASH);
    expect(loaded.config.headers).toEqual({ 'X-Content-Type-Options': 'nosniff', 'X-Frame-Options': 'deny' });
  });
});
