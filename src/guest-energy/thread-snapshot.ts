/** A VM's threads as read at one of QEMU's window edges. */

export interface ThreadRead {
  tid: number;
  /** utime + stime. */
  ticks: number;
  /** Field 22: a different value under the same tid is another thread. */
  starttime: number;
  /** The host package of the CPU it last ran on (-1 when the CPU is not in the host map). */
  pkg: number;
}

/** The threads of one process at one instant, by tid; the main thread (tid = pid) is never listed (QEMU skips it). */
export type ThreadSnapshot = ReadonlyMap<number, ThreadRead>;
