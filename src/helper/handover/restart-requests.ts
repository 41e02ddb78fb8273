/**
 * When a restart in place may execute: only once restarts stopped being asked for RESTART_QUIET_MS
 * (docs/security.md, "A second SIGHUP during a restart"). Each SIGHUP asks; one that comes while a
 * restart runs is not a second restart but pushes the exec back, so a burst of them (logrotate twice,
 * `systemctl reload` twice, 100 in a second) is over before the exec, and none arrives while the new
 * image starts, where Node's own start-up leaves SIGHUP at its default (os/sighup-hold.ts). The old
 * image serves all the while: the wait delays the restart, never a reply.
 */

/** How long no restart may have been asked before the exec. */
export const RESTART_QUIET_MS = 1000;
/**
 * Longest the check of the installed binary (`--version`) may take before the restart is called off:
 * far above its second or two, as a host busy with other users' work took over 10 s.
 */
export const RESTART_CHECK_TIMEOUT_MS = 30_000;

export class RestartRequests {
  private lastAt = -Infinity;
  private meanwhile = 0;

  constructor(private readonly now: () => number = () => performance.now()) {}

  /** The restart that runs was asked for. */
  first(): void {
    this.lastAt = this.now();
    this.meanwhile = 0;
  }

  /** Another restart was asked while one runs: it is the same restart, later. */
  again(): void {
    this.lastAt = this.now();
    this.meanwhile++;
  }

  /** Resolves once no restart was asked for `quietMs`, with how many were asked after the first. */
  async quiet(quietMs = RESTART_QUIET_MS): Promise<number> {
    for (let left = quietMs; left > 0; left = this.lastAt + quietMs - this.now()) await new Promise((r) => setTimeout(r, left));
    return this.meanwhile;
  }
}
