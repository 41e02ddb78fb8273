/**
 * /proc/<pid>/task/<tid>/stat parsing: fields count from the LAST ')' (comm may be "q) 1 (x y"). Every thread, every
 * interval: one backward pass over a reused buffer, no field array, no substring but comm and state.
 */
import { fail, ok, type Result } from '../common/result.js';
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

/** Fields are numbered as in proc(5); field 3 (state) is the first after the LAST ')'. */
const AFTER_COMM = 3;
/** Digits of the largest u64 (the kernel prints fields as at most unsigned 64-bit). */
const MAX_DIGITS = 20;
/** Up to this many digits a decimal is below 2^53, so digit-by-digit accumulation is exact. */
const EXACT_DIGITS = 15;
const SPACE = 0x20;
const OPEN = 0x28; // '('
const CLOSE = 0x29; // ')'
const NOT_UINT = -1;
const TOO_LARGE = -2;

/** The line as bytes, byte i = character i; above U+00FF becomes 0x80, so no character passes for a space, '(', ')' or digit. */
let scratch = Buffer.allocUnsafe(4096);
function toBytes(line: string): Buffer {
  if (line.length > scratch.length) scratch = Buffer.allocUnsafe(line.length * 2);
  if (Buffer.byteLength(line, 'utf8') === line.length) {
    scratch.write(line, 0, 'latin1');
    return scratch;
  }
  for (let i = 0; i < line.length; i++) {
    const c = line.charCodeAt(i);
    scratch[i] = c > 0xff ? 0x80 : c;
  }
  return scratch;
}

/** The unsigned decimal in b[start, end): its value, NOT_UINT, or TOO_LARGE (beyond 2^53). */
function uintAt(b: Buffer, line: string, start: number, end: number): number {
  const n = end - start;
  if (n < 1 || n > MAX_DIGITS) return NOT_UINT;
  let v = 0;
  for (let i = start; i < end; i++) {
    const d = b[i]! - 0x30;
    if (d < 0 || d > 9) return NOT_UINT;
    v = v * 10 + d;
  }
  if (n <= EXACT_DIGITS) return v;
  v = Number(line.slice(start, end)); // correctly rounded, where accumulation may not be
  return Number.isSafeInteger(v) ? v : TOO_LARGE;
}

/** Index of the first " (" in b[0, len), or -1. */
function openParen(b: Buffer, len: number): number {
  for (let i = 0; i + 1 < len; i++) if (b[i] === SPACE && b[i + 1] === OPEN) return i;
  return -1;
}

/** Backward to the LAST ')' (index or -1), the separators met kept in a ring (RING > the 37 up to field 39). Not re-entrant. */
const RING = 64;
const spaces = new Int32Array(RING);
let spaceCount = 0;
function scanBack(b: Buffer, len: number): number {
  let n = 0;
  for (let i = len - 1; i >= 0; i--) {
    const c = b[i];
    if (c === CLOSE) {
      spaceCount = n;
      return i;
    }
    if (c === SPACE) spaces[n++ & (RING - 1)] = i;
  }
  spaceCount = n;
  return -1;
}

/** Start of field `field` (>= 3) after a scanBack that found the ')'; needs field - 3 < spaceCount. */
function fieldStart(field: number): number {
  return spaces[(spaceCount - 1 - (field - AFTER_COMM)) & (RING - 1)]! + 1;
}

/** End (exclusive) of field `field`: the separator after it, or the end of the line. */
function fieldEnd(len: number, field: number): number {
  const k = field - AFTER_COMM + 1;
  return k < spaceCount ? spaces[(spaceCount - 1 - k) & (RING - 1)]! : len;
}

const FIELDS = [
  [14, 'utime'],
  [15, 'stime'],
  [22, 'starttime'],
  [39, 'processor'],
] as const;

/** Parses one stat line; never throws: a failure (with why) for anything that is not a stat line. */
export function parseStatLine(line: string): Result<TaskStat> {
  if (typeof line !== 'string') return fail('not a string');
  const len = line.length;
  const b = toBytes(line);
  const open = openParen(b, len);
  const close = scanBack(b, len);
  if (open <= 0 || close < open + 1) return fail('no "pid (comm)" at the start');
  const tid = uintAt(b, line, 0, open);
  if (tid === NOT_UINT) return fail(`pid field is not a number: ${JSON.stringify(line.slice(0, open).slice(0, 20))}`);
  if (close + 1 >= len || b[close + 1] !== SPACE) return fail('nothing after the command name');
  // The separator after ')' is the first space counted: spaceCount fields from field 3 on; only those up to 39 are read.
  const last = FIELDS[FIELDS.length - 1]![0];
  if (spaceCount < last - AFTER_COMM + 1) return fail(`only ${spaceCount + AFTER_COMM - 1} fields, need at least 39`);
  const values = [0, 0, 0, 0];
  for (let i = 0; i < FIELDS.length; i++) {
    const [field, name] = FIELDS[i]!;
    const pos = fieldStart(field);
    const end = fieldEnd(len, field);
    const v = uintAt(b, line, pos, end);
    if (v === NOT_UINT) return fail(`${name} (field ${field}) is not an unsigned integer: ${JSON.stringify(line.slice(pos, end))}`);
    if (v === TOO_LARGE) return fail(`${name} (field ${field}) is too large: ${line.slice(pos, end)}`);
    values[i] = v;
  }
  return ok({
    // A 20-digit pid is not a pid, but the old parser returned it: kept so every rule stays.
    tid: tid === TOO_LARGE ? Number(line.slice(0, open)) : tid,
    comm: line.slice(open + 2, close),
    state: line.slice(close + 2, fieldEnd(len, AFTER_COMM)),
    utime: values[0]!,
    stime: values[1]!,
    starttime: values[2]!,
    processor: values[3]!,
  });
}

/** Field 20 (num_threads) of a stat line, or -1 when it cannot be read. */
export function statNumThreads(line: string): number {
  const b = toBytes(line);
  const close = scanBack(b, line.length);
  if (close < 0 || spaceCount < 20 - AFTER_COMM + 1) return -1;
  const v = uintAt(b, line, fieldStart(20), fieldEnd(line.length, 20));
  return v < 0 ? -1 : v;
}
