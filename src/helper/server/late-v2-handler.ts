/** A v2 handler bound after the server serves (QEMU first: docs/daemon.md "Restarts"); v2 connections wait, paused, until then. */
import type { V2Handler } from './server.js';

/** `handler`, what the server calls, holds each connection until `bind` hands the real handler every one held so far, in order. */
export function lateV2Handler(): { readonly handler: V2Handler; bind(real: V2Handler): void; readonly held: number } {
  let real: V2Handler | undefined;
  const waiting: Parameters<V2Handler>[] = [];
  return {
    handler: (socket, peer, rest, hold) => {
      if (real) return real(socket, peer, rest, hold);
      socket.pause();
      waiting.push([socket, peer, rest, hold]);
    },
    bind(h) {
      real = h;
      for (const args of waiting.splice(0)) {
        if (args[0].destroyed) continue;
        try {
          h(...args);
        } catch {
          args[0].destroy();
        }
      }
    },
    get held() {
      return waiting.length;
    },
  };
}
