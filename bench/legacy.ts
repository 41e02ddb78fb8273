/**
 * Legacy protocol throughput and latency: a real helper child on fake MSR files, with 1, 16 and 256
 * concurrent QEMU-like clients each sending 0x611 requests one at a time (as QEMU does).
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { encodeLegacyRequest } from '../src/protocol/legacy.js';
import { MSR_PKG_ENERGY_STATUS } from '../src/msr/registers.js';

const BIN = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../src/bin/vmsr-helper.js');

function fakeHost(dir: string): string[] {
  const cpuDir = path.join(dir, 'sys/devices/system/cpu');
  fs.mkdirSync(path.join(cpuDir, 'cpu0/topology'), { recursive: true });
  fs.writeFileSync(path.join(cpuDir, 'online'), '0\n');
  fs.writeFileSync(path.join(cpuDir, 'cpu0/topology/physical_package_id'), '0\n');
  fs.mkdirSync(path.join(dir, 'dev/cpu/0'), { recursive: true });
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(0x12345678n);
  const fd = fs.openSync(path.join(dir, 'dev/cpu/0/msr'), 'w');
  fs.writeSync(fd, b, 0, 8, 0x611);
  fs.closeSync(fd);
  return ['--msr-path', path.join(dir, 'dev/cpu/%u/msr'), '--sys-root', path.join(dir, 'sys'), '--vendor', 'intel', '-q'];
}

/** One client: `n` sequential requests; returns each round-trip in microseconds. */
async function client(sock: string, n: number): Promise<number[]> {
  const s = net.connect({ path: sock });
  await new Promise<void>((resolve, reject) => {
    s.once('connect', resolve);
    s.once('error', reject);
  });
  const reqBuf = encodeLegacyRequest({ msr: MSR_PKG_ENERGY_STATUS, cpu: 0, tid: process.pid });
  const lat: number[] = [];
  let pending = 0;
  let resolveReply: (() => void) | undefined;
  s.on('data', (d: Buffer) => {
    pending += d.length;
    while (pending >= 8 && resolveReply) {
      pending -= 8;
      const r = resolveReply;
      resolveReply = undefined;
      r();
    }
  });
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    await new Promise<void>((r) => {
      resolveReply = r;
      s.write(reqBuf);
    });
    lat.push(Number(process.hrtime.bigint() - t0) / 1000);
  }
  s.destroy();
  return lat;
}

function pct(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;
}

export async function run(): Promise<void> {
  console.log('\n== legacy protocol: requests/s and round-trip latency (real helper child, fake MSR files)');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-bench-legacy-'));
  const sock = path.join(dir, 'h.sock');
  const child = spawn(process.execPath, [BIN, '-k', sock, ...fakeHost(dir)], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  try {
    const end = Date.now() + 10_000;
    while (!fs.existsSync(sock)) {
      if (child.exitCode !== null || Date.now() > end) throw new Error(`helper did not start: ${err.trim()}`);
      await new Promise((r) => setTimeout(r, 20));
    }
    const rows: string[][] = [['clients', 'requests', 'req/s', 'p50 µs', 'p99 µs']];
    for (const clients of [1, 16, 256]) {
      const perClient = Math.max(40, Math.floor(20_000 / clients));
      await Promise.all(Array.from({ length: Math.min(clients, 16) }, () => client(sock, 20))); // warm-up
      const t0 = process.hrtime.bigint();
      const all = (await Promise.all(Array.from({ length: clients }, () => client(sock, perClient)))).flat();
      const secs = Number(process.hrtime.bigint() - t0) / 1e9;
      all.sort((a, b) => a - b);
      rows.push([String(clients), String(all.length), (all.length / secs).toFixed(0), pct(all, 50).toFixed(1), pct(all, 99).toFixed(1)]);
    }
    const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
    for (const r of rows) console.log(r.map((c, i) => c.padStart(widths[i]!)).join('  '));
  } finally {
    child.kill('SIGTERM');
    await new Promise((r) => (child.exitCode !== null ? r(null) : child.once('exit', r)));
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

// Run directly: node dist/bench/legacy.js
if (process.argv[1] && fileURLToPath(import.meta.url) === path.resolve(process.argv[1])) await run();
