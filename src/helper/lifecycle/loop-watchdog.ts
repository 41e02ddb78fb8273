/**
 * The serving process's own watchdog (docs/daemon.md "Crashes"): an event loop stalled for
 * LOOP_STALL_S seconds is a crash. alarm(2) is armed LOOP_STALL_S ahead and armed again every
 * second from the event loop; a loop that stops turning (a computation that never ends, a
 * synchronous call that never returns) does not re-arm it, and SIGALRM, which nothing in the
 * process handles, ends it: the keeper (or systemd) starts it again and its crash restore brings
 * every connection back. A hung loop runs no SIGTERM handler either: the watchdog ends it all the
 * same. No thread, one system call a second (and a beat to the keeper: keeper/deaths.ts). An alarm survives execve: a restart in place disarms
 * it first (disarmLoopWatchdog).
 */
import os from 'node:os';
import { alarm, ignoreSignal } from '../../os/libc/processes.js';

/** Seconds the event loop may stall before the process is ended. */
const LOOP_STALL_S = 10;

let beat: NodeJS.Timeout | undefined;
/** Told at every beat (the keeper's, handover/outside-keep.ts: a SIGALRM from a silent loop is this watchdog's). */
let onBeat: () => void = () => {};

/** Starts the watchdog (again: the last one's timer replaced); `stallS` for tests. */
export function startLoopWatchdog(stallS = LOOP_STALL_S): void {
  disarmLoopWatchdog();
  alarm(stallS);
  beat = setInterval(() => {
    alarm(stallS);
    onBeat();
  }, 1000);
  beat.unref();
}

/** `tell` is called at every beat of this watchdog, started or started again. */
export function tellLoopBeats(tell: () => void): void {
  onBeat = tell;
}

/** No SIGALRM from here on (before an exec, which would carry it). */
export function disarmLoopWatchdog(): void {
  if (beat !== undefined) clearInterval(beat);
  beat = undefined;
  alarm(0);
}

/**
 * The signals of a fault (docs/security.md "The -u user ending the service"): the kernel forces them
 * on the thread that faulted, putting back the default action if they are ignored, so a real fault
 * still ends the process with its signal (and the keeper counts it); the same signal sent by another
 * process (`kill -SEGV`, which any process of -u's user may send) is ignored. SIGABRT the same way:
 * the process's own (Node's fatal errors, process.abort()) comes from the C library's abort(), which
 * puts the default action back and raises it again when it is ignored, so it still ends the process
 * with SIGABRT; a `kill -ABRT` from another process is ignored.
 */
const FORCED_FAULTS = ['SIGSEGV', 'SIGBUS', 'SIGILL', 'SIGFPE', 'SIGTRAP', 'SIGSYS', 'SIGABRT'] as const;

/** Ignores FORCED_FAULTS sent from outside, from now on (Node's start put them back to their default). */
export function ignoreSentFaults(): void {
  for (const sig of FORCED_FAULTS) ignoreSignal(os.constants.signals[sig]);
}
