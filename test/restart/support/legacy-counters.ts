/**
 * The daemon's legacy request counters (answered, refused, failed), as a v2 client reads them from
 * HOST_SUBSCRIBE's statistics: carried across restarts (docs/daemon.md "Restarts"), so a restart test
 * can check that every request was counted once. `inside` runs the client in another PID namespace
 * (a daemon there refuses a peer it sees as pid 0): a child Node process wrapped by it, e.g.
 * RealSystemd.inside.
 */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import { V2Client } from '../../../src/client/v2-client.js';
import { ROOT } from '../../daemon/support/daemon-process.js';

export interface LegacyCounters {
  ok: number;
  refused: number;
  failed: number;
}

export async function legacyCounters(sock: string, inside?: (argv: readonly string[]) => string[]): Promise<LegacyCounters> {
  if (!inside) {
    const c = await V2Client.connect(sock);
    try {
      const { stats } = await c.subscribeHost(() => {});
      return { ok: Number(stats.legacyOk), refused: Number(stats.legacyRefused), failed: Number(stats.legacyFailed) };
    } finally {
      await c.close();
    }
  }
  const client = pathToFileURL(path.join(ROOT, 'dist/src/client/v2-client.js')).href;
  const script = `const { V2Client } = await import(${JSON.stringify(client)});
const c = await V2Client.connect(${JSON.stringify(sock)});
const { stats } = await c.subscribeHost(() => {});
await c.close();
console.log(JSON.stringify({ ok: Number(stats.legacyOk), refused: Number(stats.legacyRefused), failed: Number(stats.legacyFailed) }));`;
  const [cmd, ...args] = inside([process.execPath, '--input-type=module', '-e', script]);
  const { stdout } = await promisify(execFile)(cmd!, args, { encoding: 'utf8', timeout: 30_000 });
  return JSON.parse(stdout.trim()) as LegacyCounters;
}
