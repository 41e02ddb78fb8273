/**
 * THE PREVIOUS stat parser (slices and a field array), kept as it was (its types now imported) as
 * the reference the fast parser in src/ratio/stat.ts is property-tested against. Not used by the
 * helper.
 *
 * /proc/<pid>/task/<tid>/stat parsing. The command name (field 2) may hold spaces and parentheses
 * ("CPU 0/KVM", "q) 1 (x y"), so fields are counted from the LAST ')' of the line.
 */

import { fail, ok, type Result } from '../../src/common/result.js';
import type { TaskStat } from '../../src/ratio/stat.js';

/** The previous parser's failure shape (the fast parser returns a Result; see referenceResult). */
interface StatParseError {
  error: string;
}

// Index of field N in the list that starts at field 3 (state).
const AFTER_COMM = 3;
const F_UTIME = 14 - AFTER_COMM;
const F_STIME = 15 - AFTER_COMM;
const F_STARTTIME = 22 - AFTER_COMM;
const F_PROCESSOR = 39 - AFTER_COMM;

const UINT = /^\d{1,20}$/;

function uintField(text: string | undefined, field: number, name: string): number | StatParseError {
  if (text === undefined || !UINT.test(text))
    return { error: `${name} (field ${field}) is not an unsigned integer: ${JSON.stringify(text)}` };
  const v = Number(text);
  if (!Number.isSafeInteger(v)) return { error: `${name} (field ${field}) is too large: ${text}` };
  return v;
}

function isError(v: unknown): v is StatParseError {
  return typeof v === 'object' && v !== null && 'error' in v;
}

/** Parses one stat line; never throws, returns { error } for anything that is not a stat line. */
export function referenceParseStatLine(line: string): TaskStat | StatParseError {
  if (typeof line !== 'string') return { error: 'not a string' };
  const open = line.indexOf(' (');
  const close = line.lastIndexOf(')');
  if (open <= 0 || close < open + 1) return { error: 'no "pid (comm)" at the start' };
  const tidText = line.slice(0, open);
  if (!UINT.test(tidText)) return { error: `pid field is not a number: ${JSON.stringify(tidText.slice(0, 20))}` };
  if (line[close + 1] !== ' ') return { error: 'nothing after the command name' };
  // Walk the fields up to 39 only: the sampler parses thousands of lines a second and the tail is unused.
  const fields: string[] = [];
  let pos = close + 2;
  while (fields.length <= F_PROCESSOR) {
    const next = line.indexOf(' ', pos);
    if (next < 0) {
      fields.push(line.slice(pos));
      break;
    }
    fields.push(line.slice(pos, next));
    pos = next + 1;
  }
  if (fields.length <= F_PROCESSOR) return { error: `only ${fields.length + AFTER_COMM - 1} fields, need at least 39` };
  const values: number[] = [];
  for (const [i, name] of [
    [F_UTIME, 'utime'],
    [F_STIME, 'stime'],
    [F_STARTTIME, 'starttime'],
    [F_PROCESSOR, 'processor'],
  ] as const) {
    const v = uintField(fields[i], i + AFTER_COMM, name);
    if (isError(v)) return v;
    values.push(v);
  }
  const [utime, stime, starttime, processor] = values as [number, number, number, number];
  return { tid: Number(tidText), comm: line.slice(open + 2, close), state: fields[0] ?? '', utime, stime, starttime, processor };
}

/** The reference parser's answer in the fast parser's Result shape, for comparing the two. */
export function referenceResult(line: string): Result<TaskStat> {
  const r = referenceParseStatLine(line);
  return isError(r) ? fail(r.error) : ok(r);
}
