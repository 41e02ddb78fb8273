/**
 * A discovered VM's virtual packages come from its vCPU threads, not from its command line's claim:
 * a process may say `-smp sockets=256` and name one thread `CPU 255/KVM`, and each virtual package
 * is two series in every exporter and 16 bytes of every UPDATE. So only a guest socket that holds a
 * vCPU thread gets a virtual package, and the VM never has more virtual packages than the most
 * guest sockets its threads have been in at once. Pure. Rule: docs/discovery.md, "Virtual packages
 * are what the threads show".
 *
 * Numbering: at discovery, the sockets in use get 0, 1, 2, ... in socket order, so a VM whose
 * sockets all hold vCPUs (every VM started without CPU hotplug) has vpkg n = guest socket n. A
 * socket seen later gets the next number; a number is never taken back from a socket that still
 * has threads, so a virtual package's counter keeps meaning the same socket. When there are as
 * many numbers as the most sockets ever in use at once, a new socket takes the lowest number of a
 * socket that no longer has a vCPU thread (its energy goes on from that counter).
 */
export class VpkgNumbering {
  /** Guest socket -> virtual package; the values are 0..size-1, each once. */
  private readonly bySocket = new Map<number, number>();
  /** The most sockets in use at once. */
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
      // Every number is given out: take the lowest one whose socket holds no vCPU now (one exists:
      // the sockets in use, this one among them, are at most `peak` = the numbers given out).
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
