/** Each sample's frames to whoever watches, each encoded once; and the unrequested ones (a dropped VM's last UPDATE, an outage notice). */
import { E, T, encodeError } from '../../protocol/v2/codec.js';
import { unwatch, type Clients, type Subscriber } from './clients.js';
import type { VmUpdateFrame } from './vm-update-frame.js';

/** How this sample's frames are made (each called at most once per key and sample). */
export interface SampleFrames {
  /** VM `vmId`'s UPDATE, or null when it has no output (gone). */
  update(vmId: number): VmUpdateFrame | null;
  /** HOST_UPDATE in one layout (with or without per-package unattributed energy, with or without the other domains). */
  host(perPackage: boolean, domains: boolean): Buffer;
}

export class FanOut<C extends Subscriber> {
  constructor(private readonly clients: Clients<C>) {}

  /** One sample's frames to every connection that watches something. */
  sample(frames: SampleFrames): void {
    const update = once(frames.update.bind(frames));
    // Keyed by layout: bit 0 per package, bit 1 domains.
    const host = once((k: number) => frames.host((k & 1) !== 0, (k & 2) !== 0));
    for (const { conn, hostPerPackage, hostDomains } of this.clients) {
      if (conn.subscriptions.size === 0 && hostPerPackage === undefined) continue;
      // A connection's frames of one sample leave in one write: its VMs' UPDATEs, then HOST_UPDATE.
      conn.batch(() => {
        for (const vmId of conn.subscriptions) {
          const u = update(vmId);
          if (!u) continue;
          const frame = u.frame(conn.domainSubscriptions.has(vmId));
          if (u.ended) unwatch(conn, vmId);
          if (!conn.send(frame)) return;
        }
        if (hostPerPackage !== undefined) conn.send(host((hostPerPackage ? 1 : 0) | (hostDomains ? 2 : 0)));
      });
    }
  }

  /** A VM is dropped: whoever still watches it gets `last` (its UPDATE with ENDED, in its layout) and stops watching. */
  dropped(vmId: number, last: VmUpdateFrame): void {
    for (const { conn } of this.clients) {
      const domains = conn.domainSubscriptions.has(vmId);
      if (unwatch(conn, vmId)) conn.send(last.frame(domains));
    }
  }

  /** Sampling started failing (once per outage): each subscriber, of VMs or the host, gets one notice. */
  failed(err: Error): void {
    for (const { conn, hostPerPackage } of this.clients) {
      if (conn.subscriptions.size > 0 || hostPerPackage !== undefined) {
        conn.send(encodeError(E.ENERGY_SOURCE, T.SUBSCRIBE, `sampling failed: ${err.message}; updates resume when it recovers`));
      }
    }
  }
}

/** `make` memoised per key, for one sample. */
function once<K, V>(make: (k: K) => V): (k: K) => V {
  const made = new Map<K, V>();
  return (k) => {
    if (!made.has(k)) made.set(k, make(k));
    return made.get(k)!;
  };
}
