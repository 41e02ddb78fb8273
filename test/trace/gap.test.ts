/**
 * The `gap` record (docs/trace-format.md): a recorder whose disk was full lost samples, and replay
 * must take the sample after the gap as a new baseline. And the writer's file is a whole gzip
 * trace after every record (docs/recording.md, "A full disk"); the full disk itself is run for real
 * in test/hostile/full-disk-leaves-a-whole-trace.test.ts.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import zlib from 'node:zlib';
import { describe, expect, test } from 'vitest';
import { replayRecords } from '../../src/ratio/trace-replay.js';
import type { Sample, TraceHeader } from '../../src/model/sample.js';
import { readTrace, readTraceStream } from '../../src/trace/reader.js';
import { gapLine, headerLine, registerLine, sampleLine, TraceWriter } from '../../src/trace/writer.js';
import { host, statLine } from '../ratio/helpers.js';

const PID = 100;
const header: TraceHeader = { host: host([2]) };

function sample(s: number, energy: bigint, utime: number): Sample {
  return {
    tNs: BigInt(s) * 1_000_000_000n,
    energy: new Map([[0, energy]]),
    tasks: new Map([[PID, new Map([[PID, statLine({ tid: PID, utime, starttime: 5, processor: 0 })]])]]),
  };
}

const vm = { pid: PID, starttime: 5, vcpus: [{ tid: PID, vpkg: 0 }] };

async function totalJ(lines: string[]): Promise<{ joules: number; intervals: number; problems: string[] }> {
  const summary = await replayRecords(readTraceStream(Readable.from([Buffer.from(lines.join(''))])));
  return {
    joules: summary.vms[0]!.output.vpkgs.reduce((a, v) => a + v.energyJ, 0),
    intervals: summary.intervals,
    problems: summary.problems.first,
  };
}

describe('the gap record', () => {
  test('replay attributes no energy across a gap and takes the sample after it as a new baseline', async () => {
    const before = [sample(1, 0n, 0), sample(2, 16_384n, 50)];
    // Across the gap the counter moved by an unknown amount (here: most of a wrap).
    const after = [sample(60, 0xf000_0000n, 3000), sample(61, 0xf000_0000n + 32_768n, 3080)];
    const head = [headerLine(header), registerLine(0n, vm)];
    const withGap = await totalJ([...head, ...before.map(sampleLine), gapLine(3_000_000_000n, 57), ...after.map(sampleLine)]);
    const first = await totalJ([...head, ...before.map(sampleLine)]);
    const second = await totalJ([...head, ...after.map(sampleLine)]);
    expect(withGap.intervals).toBe(2);
    expect(first.joules).toBeGreaterThan(0);
    expect(withGap.joules).toBeCloseTo(first.joules + second.joules, 9);
    expect(withGap.problems.join('\n')).toMatch(/57 samples missing from here/);
    // Without the gap record the same samples would attribute the wrap's energy.
    const noGap = await totalJ([...head, ...before.map(sampleLine), ...after.map(sampleLine)]);
    expect(noGap.joules).toBeGreaterThan(withGap.joules * 10);
  });

  test('a reader refuses a gap without a count', async () => {
    const lines = [headerLine(header), '{"type":"gap","t_ns":5}\n'];
    await expect(replayRecords(readTraceStream(Readable.from([Buffer.from(lines.join(''))])))).rejects.toThrow(
      /lost_samples must be a non-negative integer/,
    );
  });
});

describe('the writer', () => {
  test('a .gz trace is a whole gzip file that replays after every record, before close', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-gap-'));
    try {
      const f = path.join(dir, 't.jsonl.gz');
      const w = TraceWriter.open(f, header);
      w.register(0n, vm);
      for (let i = 1; i <= 50; i++) {
        w.sample(sample(i, BigInt(i) * 1000n, i * 3));
        const text = zlib.gunzipSync(fs.readFileSync(f)).toString();
        expect(text.split('\n')).toHaveLength(i + 3);
      }
      const mid: unknown[] = [];
      for await (const r of readTrace(f)) mid.push(r);
      expect(mid).toHaveLength(52);
      await w.close();
      expect(zlib.gunzipSync(fs.readFileSync(f)).toString().split('\n')).toHaveLength(53);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
