import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import { dropCleanFilePages, isCleanFileMapping, parseSmaps, type Mapping } from '../../src/os/mapped-files.js';

const block = (header: string, fields: Record<string, number>, flags = 'rd mr mw me') =>
  [header, ...Object.entries(fields).map(([k, v]) => `${k}:${' '.repeat(Math.max(1, 16 - k.length))}${v} kB`), `VmFlags: ${flags} `].join(
    '\n',
  );

const SMAPS = [
  block('00400000-00b6f000 r--p 00000000 08:01 1234                               /usr/bin/node', {
    Size: 7612,
    Rss: 4200,
    Anonymous: 0,
    Locked: 0,
  }),
  block(
    '00b72000-025fe000 r-xp 00772000 08:01 1234                               /usr/bin/node',
    { Size: 27184, Rss: 16000, Anonymous: 8, Locked: 0 },
    'rd ex mr mw me',
  ),
  block(
    '0563e000-0565c000 rw-p 0523d000 08:01 1234                               /usr/bin/node',
    { Size: 120, Rss: 120, Anonymous: 40, Locked: 0 },
    'rd wr mr mw me ac',
  ),
  block('7f0000000000-7f0000010000 r--p 00000000 08:01 99 /opt/my app/lib (x).so (deleted)', {
    Size: 64,
    Rss: 64,
    Anonymous: 0,
    Locked: 0,
  }),
  block(
    '7f0000020000-7f0000030000 r--p 00000000 08:01 98 /opt/locked.so',
    { Size: 64, Rss: 64, Anonymous: 0, Locked: 64 },
    'rd mr mw me lo',
  ),
  block('7f0000040000-7f0000050000 r--s 00000000 00:05 97 /dev/mem', { Size: 64, Rss: 64, Anonymous: 0, Locked: 0 }, 'rd sh mr io pf'),
  block('7f0000060000-7f0000070000 r--p 00000000 08:01 96 /opt/cold.so', { Size: 64, Rss: 0, Anonymous: 0, Locked: 0 }),
  block('7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]', { Size: 8, Rss: 8, Anonymous: 0, Locked: 0 }),
  block('7f0000080000-7f0000090000 rw-p 00000000 00:00 0 ', { Size: 64, Rss: 64, Anonymous: 64, Locked: 0 }),
  // a block whose fields cannot be read: nothing known, nothing dropped
  '7f00000a0000-7f00000b0000 r--p 00000000 08:01 95 /opt/odd.so\nRss: lots\nAnonymous: none',
].join('\n');

describe('parseSmaps', () => {
  it('reads each mapping: range, perms, a path with spaces, parentheses and (deleted), Rss/Anonymous/Locked and VmFlags', () => {
    const ms = parseSmaps(SMAPS);
    expect(ms).toHaveLength(10);
    expect(ms[0]).toEqual({
      start: 0x400000n,
      end: 0xb6f000n,
      perms: 'r--p',
      path: '/usr/bin/node',
      rssKb: 4200,
      anonKb: 0,
      lockedKb: 0,
      flags: ['rd', 'mr', 'mw', 'me'],
    });
    expect(ms[3]!.path).toBe('/opt/my app/lib (x).so (deleted)');
    expect(ms[5]!.flags).toContain('io');
    expect(ms[7]!.path).toBe('[vdso]');
    expect(ms[8]!.path).toBe('');
    expect(ms[9]).toMatchObject({ path: '/opt/odd.so', rssKb: -1, anonKb: -1 });
  });

  it('ignores lines before the first header and lines of no known shape', () => {
    expect(parseSmaps('garbage\nRss: 5 kB\n')).toEqual([]);
    expect(parseSmaps('')).toEqual([]);
  });
});

describe('isCleanFileMapping', () => {
  it('accepts only read-only file mappings with resident pages, no anonymous or locked page, no device flag', () => {
    const verdicts = parseSmaps(SMAPS).map((m) => [m.path, m.perms, isCleanFileMapping(m)]);
    expect(verdicts).toEqual([
      ['/usr/bin/node', 'r--p', true],
      ['/usr/bin/node', 'r-xp', false], // 8 kB copied on write (a debugger's breakpoint): would be lost
      ['/usr/bin/node', 'rw-p', false], // writable
      ['/opt/my app/lib (x).so (deleted)', 'r--p', true], // the inode lives on while mapped
      ['/opt/locked.so', 'r--p', false], // mlocked
      ['/dev/mem', 'r--s', false], // device mapping
      ['/opt/cold.so', 'r--p', false], // nothing resident
      ['[vdso]', 'r-xp', false], // no file
      ['', 'rw-p', false], // anonymous
      ['/opt/odd.so', 'r--p', false], // fields not readable
    ]);
  });

  it('refuses an empty or reversed range', () => {
    const m: Mapping = { start: 0x2000n, end: 0x1000n, perms: 'r--p', path: '/x', rssKb: 4, anonKb: 0, lockedKb: 0, flags: [] };
    expect(isCleanFileMapping(m)).toBe(false);
  });
});

/** Resident kB of this process: file-backed (Rss - Anonymous) and anonymous. */
function resident(): { fileKb: number; anonKb: number } {
  const t = fs.readFileSync('/proc/self/smaps_rollup', 'utf8');
  const kb = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm').exec(t)![1]);
  return { fileKb: kb('Rss') - kb('Anonymous'), anonKb: kb('Anonymous') };
}

describe('dropCleanFilePages', () => {
  it("takes this very process's clean file pages out of its page tables, and the process runs on unchanged", () => {
    const pattern = Buffer.alloc(1 << 20, 0xa5); // anonymous memory: must keep its contents
    const before = resident();
    const r = dropCleanFilePages();
    const after = resident();
    expect(r.refused).toBe(0);
    expect(r.droppedKb).toBeGreaterThan(1024);
    expect(after.fileKb).toBeLessThan(before.fileKb - 1024);
    // code and data that were dropped come back from the page cache on use
    expect(JSON.parse(JSON.stringify({ a: [1, 'x'] }))).toEqual({ a: [1, 'x'] });
    expect(new Intl.NumberFormat('de-DE').format(1234.5)).toBe('1.234,5');
    expect(/(\d+)-(\d+)/.exec('10-20')![2]).toBe('20');
    expect(pattern.every((b) => b === 0xa5)).toBe(true);
    console.log(`dropped ${r.droppedKb} kB; file-backed RSS ${before.fileKb} -> ${after.fileKb} kB`);
  });
});
