/**
 * Giving back the clean file-backed pages start-up touched (docs/performance.md): MADV_DONTNEED unmaps them, the page cache
 * keeps them. Only mappings whose every page is a clean copy of the file qualify (a written private page, e.g. a breakpoint,
 * would be lost); a smaps block not read as expected is left.
 */
import fs from 'node:fs';
import { dropMappedPages } from './libc/memfd-mmap.js';

export interface Mapping {
  start: bigint;
  end: bigint;
  /** "r-xp" and the like. */
  perms: string;
  /** The mapped file's path (may hold spaces, may end with " (deleted)"), a [pseudo] name, or ''. */
  path: string;
  /** kB; -1 when not listed. */
  rssKb: number;
  anonKb: number;
  lockedKb: number;
  /** The two-letter VmFlags ("rd", "ex", "lo", "io", ...). */
  flags: string[];
}

const HEADER = /^([0-9a-f]+)-([0-9a-f]+) ([r-][w-][x-][ps]) [0-9a-f]+ [0-9a-f]+:[0-9a-f]+ \d+ ?(.*)$/;
const FIELD = /^(\w+):\s+(\d+) kB$/;

/** The mappings of an smaps text (/proc/<pid>/smaps); lines that fit no block are ignored. */
export function parseSmaps(text: string): Mapping[] {
  const out: Mapping[] = [];
  let cur: Mapping | undefined;
  for (const line of text.split('\n')) {
    const h = HEADER.exec(line);
    if (h) {
      cur = {
        start: BigInt(`0x${h[1]}`),
        end: BigInt(`0x${h[2]}`),
        perms: h[3]!,
        path: h[4]!.trimStart(),
        rssKb: -1,
        anonKb: -1,
        lockedKb: -1,
        flags: [],
      };
      out.push(cur);
      continue;
    }
    if (!cur) continue;
    if (line.startsWith('VmFlags:')) {
      cur.flags = line
        .slice(8)
        .trim()
        .split(/\s+/)
        .filter((f) => /^[a-z0-9]{2}$/.test(f));
      continue;
    }
    const f = FIELD.exec(line);
    if (!f) continue;
    if (f[1] === 'Rss') cur.rssKb = Number(f[2]);
    else if (f[1] === 'Anonymous') cur.anonKb = Number(f[2]);
    else if (f[1] === 'Locked') cur.lockedKb = Number(f[2]);
  }
  return out;
}

/** Device, PFN, locked or huge-TLB areas: madvise(MADV_DONTNEED) refuses them or must not touch them. */
const KEEP_FLAGS = new Set(['io', 'pf', 'lo', 'ht']);

/** Whether every resident page of `m` is a clean copy of its file, so dropping it loses nothing. */
export function isCleanFileMapping(m: Mapping): boolean {
  return (
    m.path.startsWith('/') &&
    m.perms[1] === '-' &&
    m.end > m.start &&
    m.rssKb > 0 &&
    m.anonKb === 0 &&
    m.lockedKb === 0 &&
    !m.flags.some((f) => KEEP_FLAGS.has(f))
  );
}

interface DroppedPages {
  droppedKb: number;
  /** Mappings the kernel refused (left as they were). */
  refused: number;
}

/** Never throws: a mapping the kernel refuses is counted and left; an unreadable smaps drops nothing. */
export function dropCleanFilePages(): DroppedPages {
  const r: DroppedPages = { droppedKb: 0, refused: 0 };
  let text: string;
  try {
    text = fs.readFileSync('/proc/self/smaps', 'latin1');
  } catch {
    return r;
  }
  for (const m of parseSmaps(text)) {
    if (!isCleanFileMapping(m)) continue;
    try {
      dropMappedPages(m.start, m.end);
      r.droppedKb += m.rssKb;
    } catch {
      r.refused++;
    }
  }
  return r;
}
