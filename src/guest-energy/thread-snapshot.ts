export interface ThreadRead {
  tid: number;
  ticks: number;
  /** Field 22: a different value under the same tid is another thread. */
  starttime: number;
  /** -1 when the CPU is not in the host map. */
  pkg: number;
}

/** By tid; the main thread (tid = pid) is never listed (QEMU skips it). */
export type ThreadSnapshot = ReadonlyMap<number, ThreadRead>;
