/**
 * Subordinate uids (subuid(5)) are their user's: a share per uid would give one user 65,536 shares.
 * Read again when the file or /etc/passwd changed; a range whose NAME is no user is one owner, its first uid.
 */
import fs from 'node:fs';
import { resolveId } from './privileges/accounts.js';
import { readProcFileOr } from './proc-file.js';

interface Range {
  start: number;
  end: number;
  owner: number;
}

const MAX_UID = 0xffffffff;

/** The ranges of `subuid` text, owners resolved in `passwd`, sorted by start; malformed lines skipped. */
function parseSubordinateUids(subuid: string, passwd: string): Range[] {
  const ranges: Range[] = [];
  for (const line of subuid.split('\n')) {
    const m = /^([^:\s]+):(\d{1,10}):(\d{1,10})$/.exec(line.trim());
    if (m === null) continue;
    const start = Number(m[2]);
    const end = start + Number(m[3]);
    if (end <= start || end > MAX_UID + 1) continue;
    let owner = start;
    try {
      owner = resolveId(m[1]!, 'user', passwd);
    } catch {
      /* no such user: the range is one owner of its own */
    }
    ranges.push({ start, end, owner });
  }
  return ranges.sort((a, b) => a.start - b.start);
}

/** The owner of `uid` in sorted `ranges` (a range holding it), else `uid`. */
function ownerIn(ranges: readonly Range[], uid: number): number {
  let lo = 0;
  let hi = ranges.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (ranges[mid]!.start <= uid) lo = mid + 1;
    else hi = mid;
  }
  // Ranges may overlap (a misconfiguration): look back through those starting at or before uid.
  for (let i = lo - 1; i >= 0 && i >= lo - 64; i--) if (uid < ranges[i]!.end) return ranges[i]!.owner;
  return uid;
}

export class SubordinateUids {
  private seen = '';
  private ranges: Range[] = [];

  constructor(
    private readonly subuidFile = '/etc/subuid',
    private readonly passwdFile = '/etc/passwd',
  ) {}

  /** Whose `uid` is: the user whose subordinate range holds it, else `uid` itself. */
  ownerOf(uid: number): number {
    this.refresh();
    return ownerIn(this.ranges, uid);
  }

  private refresh(): void {
    const now = `${signature(this.subuidFile)} ${signature(this.passwdFile)}`;
    if (now === this.seen) return;
    this.seen = now;
    this.ranges = parseSubordinateUids(readProcFileOr(this.subuidFile, 'utf8') ?? '', readProcFileOr(this.passwdFile, 'utf8') ?? '');
  }
}

function signature(file: string): string {
  try {
    const st = fs.statSync(file, { bigint: true });
    return `${st.ino}:${st.size}:${st.mtimeNs}`;
  } catch {
    return 'missing';
  }
}
