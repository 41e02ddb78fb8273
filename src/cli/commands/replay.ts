/** `vmsr-helper replay [TRACE] [--json]`: without TRACE, the trace bundled with the package. */
import fs from 'node:fs';
import path from 'node:path';
import type { Command } from 'commander';
import { formatProblems, formatTable, intervalJsonLine, totalJsonLine } from '../../ratio/replay-report.js';
import type { IntervalResult } from '../../ratio/outputs.js';
import { replayFile, type ScanProgress } from '../../trace/reader.js';
import { ProgressLine } from '../progress.js';
import { findPackage } from '../../os/package-info.js';
import { cannotError } from '../../common/errors.js';

const BUNDLED_TRACE = 'traces/qemu-spin-vs-idle.jsonl.gz';

function bundledTracePath(): string {
  const root = findPackage()?.root;
  if (root === undefined)
    throw cannotError(
      'find the vmsr-helper package root to locate its bundled trace',
      'no package.json of vmsr-helper above this module',
      'give a TRACE path',
    );
  const p = path.join(root, BUNDLED_TRACE);
  if (!fs.existsSync(p)) throw new Error(`the bundled trace ${p} is missing (not recorded yet, or not shipped); give a TRACE path`);
  return p;
}

/** Writes to stdout honouring backpressure, so a large replay piped to `head` does not buffer everything. */
function writer() {
  let buf = '';
  let chain: Promise<void> = Promise.resolve();
  const flush = (): Promise<void> => {
    const text = buf;
    buf = '';
    if (text !== '')
      chain = chain.then(() => new Promise<void>((r) => (process.stdout.write(text) ? r() : process.stdout.once('drain', r))));
    return chain;
  };
  return {
    write(line: string): void {
      buf += line;
      if (buf.length > 1 << 16) void flush();
    },
    flush,
  };
}

async function runReplay(trace: string | undefined, opts: { json?: boolean }): Promise<void> {
  const file = trace ?? bundledTracePath();
  const out = writer();
  const progress = replayProgress(file);
  let summary;
  try {
    summary = await replayFile(
      file,
      (r) => {
        progress.interval(r);
        if (opts.json) out.write(intervalJsonLine(r) + '\n');
      },
      { onProgress: (p) => progress.scan(p) },
    );
  } finally {
    progress.end();
    // The intervals before a trace error are still shown; the error follows on stderr.
    await out.flush();
  }
  if (opts.json) out.write(totalJsonLine(summary.vms.map((v) => v.output)) + '\n');
  else out.write(formatTable(summary));
  await out.flush();
  const problems = formatProblems(summary);
  if (problems) process.stderr.write(problems);
}

/** Progress for long replays only: none for 2 s (most traces are done by then), then a line in place, or one every 10 s. */
function replayProgress(file: string, now: () => number = () => Date.now()) {
  const line = new ProgressLine(process.stderr, now);
  const start = now();
  let size = 0;
  try {
    size = fs.statSync(file).size;
  } catch {
    /* the replay reports it */
  }
  let lastMilestone = start;
  let intervals = 0;
  let firstNs: bigint | undefined;
  let traced = 0;
  let scanned: ScanProgress = { lines: 0 };
  const show = () => {
    const t = now();
    if (t - start < 2000) return;
    const milestone = t - lastMilestone >= 10_000;
    if (milestone) lastMilestone = t;
    const read = scanned.fileBytes !== undefined && size > 0 ? `, ${((100 * scanned.fileBytes) / size).toFixed(0)}% of the file read` : '';
    line.show(
      `replay ${path.basename(file)}: line ${scanned.lines}${read}, ${intervals} intervals, ${traced.toFixed(0)} s of trace, ${((t - start) / 1000).toFixed(0)} s`,
      milestone,
    );
  };
  return {
    interval(r: IntervalResult): void {
      intervals++;
      firstNs ??= r.tNs;
      traced = Number(r.tNs - firstNs) / 1e9;
      if ((intervals & 63) === 0) show();
    },
    /** Called by the reader about every 64 KiB: progress even where no record comes (e.g. blank lines). */
    scan(p: ScanProgress): void {
      scanned = p;
      show();
    },
    end(): void {
      line.clear();
    },
  };
}

export function addReplayCommand(program: Command): void {
  program
    .command('replay')
    .description('replay a vmsr-trace through the ratio engine and print per-VM, per-virtual-package energy')
    .argument(
      '[trace]',
      `trace file (.jsonl or .jsonl.gz); default: the bundled ${BUNDLED_TRACE} (three real QEMU guests' CPU time, SYNTHETIC energy)`,
    )
    .option('--json', 'print JSON lines (one interval record per sample, then the total) instead of a table')
    .action(async (trace: string | undefined, opts: { json?: boolean }) => {
      await runReplay(trace, opts);
    });
}
