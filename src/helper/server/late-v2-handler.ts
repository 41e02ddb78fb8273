/** A v2 handler bound after the server serves (QEMU first: docs/daemon.md "Restarts"); v2 connections wait, paused, until then. */
import type { V2Handler } from './server.js';

export interface LateV2Handler {
  /** What the server calls: the bound handler, or a hold until one is bound. */
  readonly handler: V2Handler;
  /** Binds the real handler and hands it every connection held so far, in order. */
  bind(real: V2Handler): void;
  /** Connections held, not handed yet. */
  readonly held: number;
}

export function lateV2Handler(): LateV2Handler {
  let real: V2Handler | undefined;
  let waiting: Parameters<V2Handler>[] = [];
  return {
    handler: (socket, peer, rest, hold) => {
      if (real) return real(socket, peer, rest, hold);
      socket.pause();
      waiting.push([socket, peer, rest, hold]);
    },
    bind(h) {
      real = h;
      const held = waiting;
      waiting = [];
      for (const args of held) {
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
