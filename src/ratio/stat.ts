/**
 * /proc/<pid>/task/<tid>/stat parsing. The command name (field 2) may hold spaces and parentheses
 * ("CPU 0/KVM", "q) 1 (x y"), so fields are counted from the LAST ')' of the line.
 *
 * The sampler parses every thread of every VM each interval, so this walks the line by character
 * code: no field array, no substrings except comm and state, numbers accumulated digit by digit.
 */

export interface TaskStat {
  tid: number;
  comm: string;
  state: string;
  /** Field 14. */
  utime: number;
  /** Field 15. */
  stime: number;
  /** Field 22: start time after boot, in clock ticks; with tid it identifies a thread. */
  starttime: number;
  /** Field 39: CPU the thread last ran on. */
  processor: number;
}

export interface StatParseError {
  error: string;
}

/** Fields are numbered as in proc(5); field 3 (state) is the first after the LAST ')'. */
const AFTER_COMM = 3;
/** Digits of the largest u64 (the kernel prints fields as at most unsigned 64-bit). */
const MAX_DIGITS = 20;
/** Up to this many digits a decimal is below 2^53, so digit-by-digit accumulation is exact. */
const EXACT_DIGITS = 15;
const SPACE = 0x20;
const NOT_UINT = -1;
const TOO_LARGE = -2;

export function isStatParseError(v: unknown): v is StatParseError {
  return typeof v === 'object' && v !== null && 'error' in v;
}

/** Index where the field after the one starting at `pos` starts, or -1 when the line ends first. */
function nextField(line: string, pos: number): number {
  const sp = line.indexOf(' ', pos);
  return sp < 0 ? -1 : sp + 1;
}

/** End (exclusive) of the field starting at `pos`: the next space or the end of the line. */
function fieldEnd(line: string, pos: number): number {
  const sp = line.indexOf(' ', pos);
  return sp < 0 ? line.length : sp;
}

/** The unsigned decimal in line[start, end): its value, NOT_UINT, or TOO_LARGE (beyond 2^53). */
function uintAt(line: string, start: number, end: number): number {
  const n = end - start;
  if (n < 1 || n > MAX_DIGITS) return NOT_UINT;
  let v = 0;
  for (let i = start; i < end; i++) {
    const d = line.charCodeAt(i) - 0x30;
    if (d < 0 || d > 9) return NOT_UINT;
    v = v * 10 + d;
  }
  if (n <= EXACT_DIGITS) return v;
  v = Number(line.slice(start, end)); // correctly rounded, where accumulation may not be
  return Number.isSafeInteger(v) ? v : TOO_LARGE;
}

/** Start of field `field`, walking from field `from` which starts at `pos`; -1 when the line ends first. */
function seek(line: string, pos: number, from: number, field: number): number {
  for (let f = from; f < field && pos >= 0; f++) pos = nextField(line, pos);
  return pos;
}

/** Fields present from field 3 on, counted up to `upTo` (what the error message reports). */
function countFields(line: string, pos: number, upTo: number): number {
  let n = 1;
  for (let p = nextField(line, pos); p >= 0 && n < upTo; p = nextField(line, p)) n++;
  return n;
}

const FIELDS = [
  [14, 'utime'],
  [15, 'stime'],
  [22, 'starttime'],
  [39, 'processor'],
] as const;

/** Parses one stat line; never throws, returns { error } for anything that is not a stat line. */
export function parseStatLine(line: string): TaskStat | StatParseError {
  if (typeof line !== 'string') return { error: 'not a string' };
  const open = line.indexOf(' (');
  const close = line.lastIndexOf(')');
  if (open <= 0 || close < open + 1) return { error: 'no "pid (comm)" at the start' };
  const tid = uintAt(line, 0, open);
  if (tid === NOT_UINT) return { error: `pid field is not a number: ${JSON.stringify(line.slice(0, open).slice(0, 20))}` };
  if (line.charCodeAt(close + 1) !== SPACE) return { error: 'nothing after the command name' };
  const first = close + 2;
  // Only fields up to 39 are walked: the tail is unused.
  const last = FIELDS[FIELDS.length - 1]![0];
  if (seek(line, first, AFTER_COMM, last) < 0) return { error: `only ${countFields(line, first, last - AFTER_COMM + 1) + AFTER_COMM - 1} fields, need at least 39` };
  const values = [0, 0, 0, 0];
  let pos = first;
  let at: number = AFTER_COMM;
  for (let i = 0; i < FIELDS.length; i++) {
    const [field, name] = FIELDS[i]!;
    pos = seek(line, pos, at, field);
    at = field;
    const end = fieldEnd(line, pos);
    const v = uintAt(line, pos, end);
    if (v === NOT_UINT) return { error: `${name} (field ${field}) is not an unsigned integer: ${JSON.stringify(line.slice(pos, end))}` };
    if (v === TOO_LARGE) return { error: `${name} (field ${field}) is too large: ${line.slice(pos, end)}` };
    values[i] = v;
  }
  return {
    // A 20-digit pid is not a pid, but the old parser returned it: kept so every rule stays.
    tid: tid === TOO_LARGE ? Number(line.slice(0, open)) : tid,
    comm: line.slice(open + 2, close),
    state: line.slice(first, fieldEnd(line, first)),
    utime: values[0]!,
    stime: values[1]!,
    starttime: values[2]!,
    processor: values[3]!,
  };
}

/** Field 20 (num_threads) of a stat line, or -1 when it cannot be read. */
export function statNumThreads(line: string): number {
  const close = line.lastIndexOf(')');
  if (close < 0) return -1;
  const pos = seek(line, close + 2, AFTER_COMM, 20);
  if (pos < 0) return -1;
  const v = uintAt(line, pos, fieldEnd(line, pos));
  return v < 0 ? -1 : v;
}
