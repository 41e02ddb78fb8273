import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { ProgressLine } from '../../src/cli/progress.js';

function sink(tty: boolean) {
  const chunks: string[] = [];
  const out = new Writable({
    write(c: Buffer, _e, cb) {
      chunks.push(c.toString());
      cb();
    },
  }) as Writable & { isTTY?: boolean };
  out.isTTY = tty;
  return { out, chunks };
}

describe('ProgressLine', () => {
  it('on a terminal rewrites one line, at most every 200 ms unless a milestone, and ends it', async () => {
    const { out, chunks } = sink(true);
    let t = 1000;
    const p = new ProgressLine(out, () => t);
    p.show('a', false);
    t += 50;
    p.show('b', false); // too soon: dropped
    p.show('c', true); // milestone: drawn
    t += 250;
    p.show('d', false);
    p.done('end');
    await new Promise((r) => setImmediate(r));
    expect(chunks).toEqual(['\ra\x1b[K', '\rc\x1b[K', '\rd\x1b[K', '\rend\x1b[K\n']);
  });

  it('elsewhere writes plain lines at milestones only, and clear() writes nothing', async () => {
    const { out, chunks } = sink(false);
    const p = new ProgressLine(out, () => 0);
    p.show('skip', false);
    p.show('one', true);
    p.clear();
    p.done('end');
    await new Promise((r) => setImmediate(r));
    expect(chunks).toEqual(['one\n', 'end\n']);
  });

  it('clear() removes a drawn terminal line once', async () => {
    const { out, chunks } = sink(true);
    const p = new ProgressLine(out, () => 0);
    p.clear();
    p.show('x', true);
    p.clear();
    p.clear();
    await new Promise((r) => setImmediate(r));
    expect(chunks).toEqual(['\rx\x1b[K', '\r\x1b[K']);
  });
});
