/** Our own watchdog (docs/daemon.md "Crashes"): alarm(2) re-armed each second from the event loop; a stalled loop's SIGALRM ends it. */
import os from 'node:os';
import { alarm, ignoreSignal } from '../../os/libc/processes.js';

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

export function tellLoopBeats(tell: () => void): void {
  onBeat = tell;
}

/** No SIGALRM from here on (before an exec: an alarm survives execve). */
export function disarmLoopWatchdog(): void {
  if (beat !== undefined) clearInterval(beat);
  beat = undefined;
  alarm(0);
}

/** Faults (docs/security.md "The -u user ending the service"): a real one (or abort()) still ends the process, one sent is ignored. */
const FORCED_FAULTS = ['SIGSEGV', 'SIGBUS', 'SIGILL', 'SIGFPE', 'SIGTRAP', 'SIGSYS', 'SIGABRT'] as const;

/** Ignores FORCED_FAULTS sent from outside, from now on (Node's start put them back to their default). */
export function ignoreSentFaults(): void {
  for (const sig of FORCED_FAULTS) ignoreSignal(os.constants.signals[sig]);
}
