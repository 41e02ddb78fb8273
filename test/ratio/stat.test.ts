/** parseStatLine on what the kernel prints, including hostile command names; never throws. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { isStatParseError, parseStatLine } from '../../src/ratio/stat.js';
import { statLine } from './helpers.js';

const REAL =
  '10010 (CPU 0/KVM) R 9956 9950 1383 0 -1 138412224 326 0 0 0 17 359 0 0 20 0 8 0 48400 601366528 10693 18446744073709551615 94110025916416 94110032702677 140724509459584 0 0 0 2147219511 4096 16963 0 0 0 -1 1 0 0 0 0 0 94110036241736 94110049791856 94110876078080 140724509464423 140724509464668 140724509464668 140724509466588 0';

describe('parseStatLine', () => {
  it('reads utime, stime, starttime and processor from a real QEMU vCPU line', () => {
    expect(parseStatLine(REAL)).toEqual({ tid: 10010, comm: 'CPU 0/KVM', state: 'R', utime: 17, stime: 359, starttime: 48400, processor: 1 });
  });

  for (const comm of ['q) 1 (x y', ') ) )', 'a b c d e f g h', '(', 'x)', '']) {
    it(`splits at the last ')' with the name ${JSON.stringify(comm)}`, () => {
      const st = parseStatLine(statLine({ tid: 7, comm, utime: 5, stime: 6, starttime: 99, processor: 3 }));
      expect(st).toEqual({ tid: 7, comm, state: 'S', utime: 5, stime: 6, starttime: 99, processor: 3 });
    });
  }

  it('reports lines truncated before the processor field instead of throwing', () => {
    const processorEnd = REAL.indexOf(' -1 1 ') + ' -1 1'.length;
    for (let cut = 0; cut < processorEnd - 2; cut++) {
      const st = parseStatLine(REAL.slice(0, cut));
      expect(isStatParseError(st)).toBe(true);
    }
  });

  it('reports non-numbers and out-of-range numbers', () => {
    expect(parseStatLine(REAL.replace(' 17 359 ', ' x 359 '))).toMatchObject({ error: expect.stringMatching(/utime/) });
    expect(parseStatLine(REAL.replace(' 48400 ', ' 99999999999999999999 '))).toMatchObject({ error: expect.stringMatching(/too large/) });
    expect(parseStatLine('abc (x) S')).toMatchObject({ error: expect.stringMatching(/pid field/) });
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
});
