/**
 * How the server holds each connection outside its process (docs/daemon.md "Crashes"): from its accept
 * until its close, or until it turns out to be v2 (a v2 client reconnects after a crash). The holder,
 * the keeper or systemd's fd store, is lifecycle/outside-keep.ts.
 */
export interface ConnectionKeep {
  /** The connection of socket fd `fd` is accepted (or adopted): held from now on. Returns what names it for released(). */
  held(fd: number | undefined): bigint | null;
  /** The connection closed or is v2: no longer held. */
  released(ino: bigint | null): void;
}
