/**
 * A discovered VM's virtual packages come from its vCPU threads, not its command line (`-smp sockets=256` would cost series
 * and UPDATE bytes): a guest socket holding a vCPU thread gets one, never more than the most sockets in use at once.
 * docs/discovery.md, "Virtual packages are what the threads show".
 */
export class VpkgNumbering {
  /** Guest socket -> virtual package; the values are 0..size-1, each once. */
  private readonly bySocket = new Map<number, number>();
  private peak = 0;

  /** Virtual packages given out so far (the VM's nvpkg as discovery sees it). */
  get count(): number {
    return this.bySocket.size;
  }

  /** The virtual package of each guest socket in `inUse` (the sockets that hold a vCPU thread now). */
  number(inUse: Iterable<number>): ReadonlyMap<number, number> {
    const sockets = [...new Set(inUse)].sort((a, b) => a - b);
    this.peak = Math.max(this.peak, sockets.length);
    const used = new Set(sockets);
    for (const s of sockets) {
      if (this.bySocket.has(s)) continue;
      if (this.bySocket.size < this.peak) {
        this.bySocket.set(s, this.bySocket.size);
        continue;
      }
      // All given out: take the lowest whose socket holds no vCPU now (one exists: the sockets in use are at most `peak`).
      let vacant: [number, number] | null = null;
      for (const [socket, vpkg] of this.bySocket) if (!used.has(socket) && (vacant === null || vpkg < vacant[1])) vacant = [socket, vpkg];
      this.bySocket.delete(vacant![0]);
      this.bySocket.set(s, vacant![1]);
    }
    const out = new Map<number, number>();
    for (const s of sockets) out.set(s, this.bySocket.get(s)!);
    return out;
  }
}
