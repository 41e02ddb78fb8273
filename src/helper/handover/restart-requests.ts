/**
 * When a restart in place may execute (docs/security.md, "A second SIGHUP during a restart"): a SIGHUP
 * while one runs pushes the exec back, so a burst is over before it and none arrives while the new
 * image starts, where SIGHUP is at its default (os/sighup-hold.ts).
 */

/** How long no restart may have been asked before the exec. */
export const RESTART_QUIET_MS = 1000;
/** Longest the installed binary's `--version` may take: far above its second or two, as a busy host took over 10 s. */
export const RESTART_CHECK_TIMEOUT_MS = 30_000;

export class RestartRequests {
  private lastAt = -Infinity;
  private meanwhile = 0;

  constructor(private readonly now: () => number = () => performance.now()) {}

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
