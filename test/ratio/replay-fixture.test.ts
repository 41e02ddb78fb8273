/**
 * Replaying the real-QEMU three-vms trace must reproduce three-vms.expected.jsonl, which came from
 * an independent implementation of ratio.md: every record, floats within 1e-9 relative, strings exact.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { afterAll, describe, expect, it } from 'vitest';
import { replayFile } from '../../src/trace/reader.js';
import { intervalJsonLine, totalJsonLine } from '../../src/ratio/replay-report.js';

const FIXTURES = path.resolve(import.meta.dirname, '../fixtures/traces');
const TRACE = path.join(FIXTURES, 'three-vms.jsonl');
const EXPECTED = path.join(FIXTURES, 'three-vms.expected.jsonl');

/** Deep comparison: numbers within 1e-9 relative (0 must be exactly 0), everything else exact. */
function sameRecord(actual: unknown, expected: unknown, where: string, errors: string[]): void {
  if (typeof expected === 'number') {
    if (typeof actual !== 'number') errors.push(`${where}: expected number ${expected}, got ${JSON.stringify(actual)}`);
    else if (actual !== expected && Math.abs(actual - expected) > 1e-9 * Math.abs(expected))
      errors.push(`${where}: ${actual} != ${expected}`);
  } else if (Array.isArray(expected)) {
    if (!Array.isArray(actual) || actual.length !== expected.length) {
      errors.push(`${where}: expected an array of ${expected.length}, got ${JSON.stringify(actual)?.slice(0, 200)}`);
      return;
    }
    expected.forEach((e, i) => sameRecord(actual[i], e, `${where}[${i}]`, errors));
  } else if (typeof expected === 'object' && expected !== null) {
    if (typeof actual !== 'object' || actual === null || Array.isArray(actual)) {
      errors.push(`${where}: expected an object, got ${JSON.stringify(actual)?.slice(0, 200)}`);
      return;
    }
    const a = actual as Record<string, unknown>;
    const keys = new Set([...Object.keys(a), ...Object.keys(expected)]);
    for (const k of keys) sameRecord(a[k], (expected as Record<string, unknown>)[k], `${where}.${k}`, errors);
  } else if (actual !== expected) {
    errors.push(`${where}: ${JSON.stringify(actual)} != ${JSON.stringify(expected)}`);
  }
}

async function replayLines(file: string): Promise<string[]> {
  const lines: string[] = [];
  const summary = await replayFile(file, (r) => lines.push(intervalJsonLine(r)));
  lines.push(totalJsonLine(summary.vms.map((v) => v.output)));
  return lines;
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-replay-fixture-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

describe('replay of test/fixtures/traces/three-vms.jsonl', () => {
  const expected = fs
    .readFileSync(EXPECTED, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as unknown);

  it('reproduces three-vms.expected.jsonl record by record', async () => {
    const actual = (await replayLines(TRACE)).map((l) => JSON.parse(l) as unknown);
    expect(actual).toHaveLength(expected.length);
    const errors: string[] = [];
    actual.forEach((a, i) => sameRecord(a, expected[i], `record ${i + 1}`, errors));
    expect(errors).toEqual([]);
  });

  it('the comparison itself catches a wrong number, a wrong string and a missing VM', () => {
    const good = expected[4] as { vms: { vpkgs: { energy_j: number }[] }[] };
    const errors: string[] = [];
    const bad = structuredClone(good);
    bad.vms[0]!.vpkgs[0]!.energy_j *= 1 + 1e-8;
    sameRecord(bad, good, 'r', errors);
    const missing = structuredClone(good);
    missing.vms.pop();
    sameRecord(missing, good, 'r', errors);
    sameRecord({ ...(expected.at(-1) as object), type: 'totals' }, expected.at(-1), 'r', errors);
    expect(errors).toHaveLength(3);
  });

  it('gives the same lines from the gzip-compressed trace', async () => {
    const gz = path.join(tmp, 'three-vms.jsonl.gz');
    fs.writeFileSync(gz, zlib.gzipSync(fs.readFileSync(TRACE)));
    expect(await replayLines(gz)).toEqual(await replayLines(TRACE));
  });

  it('reports the summary the table uses: ended flags and attributed time per VM', async () => {
    const s = await replayFile(TRACE);
    expect(s.samples).toBe(40);
    expect(s.intervals).toBe(39);
    expect(s.problems.count).toBe(0);
    expect(s.vms.map((v) => [v.output.name, v.output.ended])).toEqual([
      ['vm-a', false],
      ['vm-b', true],
      ['vm-c', false],
      ['vm-d', false],
    ]);
    // vm-a is attributed from its baseline (488.880987167 s) to the last sample (525.043411272 s).
    expect(s.vms[0]!.attributedS).toBeCloseTo(525.043411272 - 488.880987167, 9);
  });
});
