/**
 * The bench's C programs (bench/native/*.c), built with the system's compiler into a temporary
 * directory: the legacy load generator (the same for both helpers), the C stat-reading floor, the
 * VM stand-ins and the start-up timer. Each says what it does at its top.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The bench's source folder, also when running from dist/bench. */
export const BENCH_SRC = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../bench');
/** The helper's entry point as built by npm run build. */
export const HELPER_BIN = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../src/bin/vmsr-helper.js');

export const TOOLS = ['legacy-load', 'stat-floor', 'idle-threads', 'exec-to-listen', 'vmsr-thread'] as const;
export type Tools = Record<(typeof TOOLS)[number], string> & { dir: string };

/** Builds every tool, or says why it cannot (no compiler, a compile error). */
export function buildTools(): Tools | { unavailable: string } {
  const cc = process.env.CC ?? 'cc';
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-bench-tools-'));
  const out = { dir } as Tools;
  for (const t of TOOLS) {
    const r = spawnSync(cc, ['-O2', '-o', path.join(dir, t), path.join(BENCH_SRC, 'native', `${t}.c`), '-lpthread'], { encoding: 'utf8' });
    if (r.error) return { unavailable: `no C compiler (${cc}: ${r.error.message}); install gcc or set CC` };
    if (r.status !== 0) return { unavailable: `${cc} failed on ${t}.c: ${r.stderr.trim().split('\n')[0]}` };
    out[t] = path.join(dir, t);
  }
  return out;
}

/** key=value pairs of one output line, as numbers. */
export function parseFigures(line: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const m of line.matchAll(/(\w+)=([-\d.]+)/g)) out[m[1]!] = Number(m[2]);
  return out;
}

/** Runs a tool to completion; its key=value figures, or throws with its stderr. */
export function runTool(file: string, args: string[], timeoutMs = 60_000): Record<string, number> {
  const r = spawnSync(file, args, { encoding: 'utf8', timeout: timeoutMs });
  if (r.status !== 0) throw new Error(`${path.basename(file)} failed: ${(r.stderr || String(r.error ?? r.signal)).trim()}`);
  return parseFigures(r.stdout);
}

/** VmRSS of a process, MiB (NaN when it is gone). */
/**
 * Resident memory of `pid` in MiB: all of it (VmRSS), or only its anonymous part (RssAnon: heap,
 * malloc, stacks; not the pages of the node binary and libraries, which the page cache shares).
 */
export function rssMiB(pid: number, which: 'VmRSS' | 'RssAnon' = 'VmRSS'): number {
  try {
    const m = new RegExp(`^${which}:\\s+(\\d+) kB`, 'm').exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : NaN;
  } catch {
    return NaN;
  }
}

/** CPU time of every thread of a process so far, seconds (schedstat: ns on CPU). */
export function cpuSeconds(pid: number): number {
  let ns = 0;
  for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]);
    } catch {
      /* thread ended */
    }
  }
  return ns / 1e9;
}

/** Whether a connection to the Unix socket `socket` is accepted now. */
export function canConnect(socket: string): Promise<boolean> {
  return new Promise((resolve) => {
    const c = net.connect({ path: socket });
    c.once('connect', () => {
      c.destroy();
      resolve(true);
    });
    c.once('error', () => resolve(false));
  });
}

/** Resolves once `socket` accepts a connection; throws past `deadline` (Date.now() ms). */
export async function waitConnectable(socket: string, deadline: number): Promise<void> {
  while (!(await canConnect(socket))) {
    if (Date.now() > deadline) throw new Error(`the daemon did not listen on ${socket}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
