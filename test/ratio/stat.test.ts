/** parseStatLine on what the kernel prints, including hostile command names; never throws. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { parseStatLine, statNumThreads } from '../../src/ratio/stat.js';
import { statLine } from './helpers.js';
import { referenceResult } from './stat-reference.js';

const REAL =
  '10010 (CPU 0/KVM) R 9956 9950 1383 0 -1 138412224 326 0 0 0 17 359 0 0 20 0 8 0 48400 601366528 10693 18446744073709551615 94110025916416 94110032702677 140724509459584 0 0 0 2147219511 4096 16963 0 0 0 -1 1 0 0 0 0 0 94110036241736 94110049791856 94110876078080 140724509464423 140724509464668 140724509464668 140724509466588 0';

describe('parseStatLine', () => {
  it('reads utime, stime, starttime and processor from a real QEMU vCPU line', () => {
    expect(parseStatLine(REAL)).toEqual({
      ok: true,
      value: { tid: 10010, comm: 'CPU 0/KVM', state: 'R', utime: 17, stime: 359, starttime: 48400, processor: 1 },
    });
  });

  for (const comm of ['q) 1 (x y', ') ) )', 'a b c d e f g h', '(', 'x)', '']) {
    it(`splits at the last ')' with the name ${JSON.stringify(comm)}`, () => {
      const st = parseStatLine(statLine({ tid: 7, comm, utime: 5, stime: 6, starttime: 99, processor: 3 }));
      expect(st).toEqual({ ok: true, value: { tid: 7, comm, state: 'S', utime: 5, stime: 6, starttime: 99, processor: 3 } });
    });
  }

  it('reports lines truncated before the processor field instead of throwing', () => {
    const processorEnd = REAL.indexOf(' -1 1 ') + ' -1 1'.length;
    for (let cut = 0; cut < processorEnd - 2; cut++) {
      const st = parseStatLine(REAL.slice(0, cut));
      expect(st.ok).toBe(false);
    }
  });

  it('reports non-numbers and out-of-range numbers', () => {
    expect(parseStatLine(REAL.replace(' 17 359 ', ' x 359 '))).toMatchObject({ ok: false, error: expect.stringMatching(/utime/) });
    expect(parseStatLine(REAL.replace(' 48400 ', ' 99999999999999999999 '))).toMatchObject({
      ok: false,
      error: expect.stringMatching(/too large/),
    });
    expect(parseStatLine('abc (x) S')).toMatchObject({ ok: false, error: expect.stringMatching(/pid field/) });
  });

  it('never throws on arbitrary text', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 400 }), (s) => {
        const r = parseStatLine(s);
        expect(typeof r).toBe('object');
      }),
      { numRuns: 2000 },
    );
  });

  it('reads num_threads (field 20) after the last parenthesis', () => {
    expect(statNumThreads(REAL)).toBe(8);
    expect(statNumThreads(statLine({ tid: 3, comm: ') 99 (', utime: 1, starttime: 2, processor: 0 }))).toBe(8);
    expect(statNumThreads('1 (x) S 1 2')).toBe(-1);
    expect(statNumThreads('no parenthesis')).toBe(-1);
  });
});

/**
 * The walk-by-character parser gives exactly what the previous slice-and-split parser gave (kept in
 * stat-reference.ts): the same fields, and the same error message, on kernel-shaped lines with
 * hostile names, damaged fields, truncations and arbitrary text.
 */
describe('parseStatLine equals the previous parser', () => {
  const field = fc.oneof(
    fc.nat().map(String),
    fc.bigInt({ min: 0n, max: 2n ** 64n }).map(String),
    fc.constantFrom(
      '',
      '-1',
      'x',
      '1e3',
      '0x10',
      ' ',
      '007',
      '9007199254740993',
      '99999999999999999999',
      '123456789012345678901',
      '1\u0130',
      '\u0131',
      '\u00e9',
    ),
    fc.string({ maxLength: 4 }),
  );
  // U+0129, U+0120, U+0128 and U+0130 end in the bytes of ')', ' ', '(' and '0': they must not pass for them.
  const comm = fc.oneof(
    fc.string({ maxLength: 20 }),
    fc.constantFrom('CPU 0/KVM', 'q) 1 (x y', ') ) )', '(', 'x)', '', 'a\u0129 b', '\u0120\u0128\u0129', 'caf\u00e9 \u00ff'),
    fc.string({ unit: 'binary', maxLength: 12 }),
  );
  const line = fc
    .record({
      tid: fc.oneof(fc.nat().map(String), field),
      comm,
      state: fc.constantFrom('S', 'R', '', 'S S'),
      fields: fc.array(field, { minLength: 0, maxLength: 120 }),
      cut: fc.option(fc.nat(), { nil: undefined }),
    })
    .map(({ tid, comm, state, fields, cut }) => {
      const l = `${tid} (${comm}) ${[state, ...fields].join(' ')}`;
      return cut === undefined ? l : l.slice(0, cut % (l.length + 1));
    });
  const kernelShaped = fc
    .record({
      tid: fc.nat(),
      comm,
      utime: fc.nat(),
      stime: fc.nat(),
      starttime: fc.nat(),
      processor: fc.nat({ max: 4095 }),
      at: fc.nat(),
      with: field,
    })
    .map(({ at, with: w, ...f }) => {
      const parts = statLine(f).split(' ');
      // Replace one space-separated piece (maybe inside the name) with a damaged field.
      parts[at % parts.length] = w;
      return parts.join(' ');
    });

  it('on random lines, damaged kernel lines and arbitrary text', () => {
    fc.assert(
      fc.property(fc.oneof(line, kernelShaped, fc.string({ maxLength: 300 }), fc.string({ unit: 'binary', maxLength: 300 })), (l) => {
        expect(parseStatLine(l)).toEqual(referenceResult(l));
      }),
      { numRuns: 20000 },
    );
  });

  it('on lines the kernel prints for every thread of this process', async () => {
    const fs = await import('node:fs');
    for (const tid of fs.readdirSync('/proc/self/task')) {
      const l = fs.readFileSync(`/proc/self/task/${tid}/stat`, 'latin1').trimEnd();
      expect(parseStatLine(l)).toEqual(referenceResult(l));
      expect(parseStatLine(l).ok).toBe(true);
    }
  });
});
