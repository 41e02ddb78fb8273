/** Argument parsers shared by the commands: each refuses bad text with a message naming the flag. */
import { InvalidArgumentError } from 'commander';
import { parseVcpuList } from '../ratio/vm-spec.js';
import type { VcpuSpec } from '../ratio/types.js';

/** Seconds as a decimal number in [min, max] (min exclusive when 0). */
export function secondsArg(flag: string, o: { min?: number; max: number }) {
  const min = o.min ?? 0;
  return (text: string): number => {
    const n = Number(text);
    const tooLow = min === 0 ? !(n > 0) : !(n >= min);
    if (!/^\d+(\.\d+)?$/.test(text.trim()) || tooLow || n > o.max) {
      throw new InvalidArgumentError(`${flag} must be a number of seconds in ${min === 0 ? '(0' : `[${min}`}, ${o.max}], got ${JSON.stringify(text)}`);
    }
    return n;
  };
}

/** A whole number in 1..max. */
export function positiveIntArg(flag: string, max = Number.MAX_SAFE_INTEGER) {
  return (text: string): number => {
    if (!/^\d+$/.test(text)) throw new InvalidArgumentError(`${flag} must be a whole number, got ${JSON.stringify(text)}`);
    const n = Number(text);
    if (n < 1 || n > max) throw new InvalidArgumentError(`${flag} must be 1..${max}, got ${text}`);
    return n;
  };
}

/** A process id (Linux pids are at most 2^22, pid_t at most 2^30 here as everywhere in the helper). */
export function pidArg(text: string): number {
  if (!/^\d{1,10}$/.test(text) || Number(text) < 1 || Number(text) > 0x3fffffff) throw new InvalidArgumentError(`not a process id: ${JSON.stringify(text)}`);
  return Number(text);
}

/** "TID:VPKG,TID:VPKG,..." as vCPU specs. */
export function vcpuListArg(text: string): VcpuSpec[] {
  try {
    return parseVcpuList(text);
  } catch (e) {
    throw new InvalidArgumentError((e as Error).message);
  }
}

/** For repeatable options: each occurrence parsed and appended. */
export function collect<T>(parse: (text: string) => T) {
  return (text: string, prev: T[] = []): T[] => [...prev, parse(text)];
}
