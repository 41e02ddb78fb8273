/**
 * How many v2 requests the daemon answers in one turn of the event loop, all connections together:
 * Node accepts one connection per turn, so long turns keep QEMU in the listen backlog (docs/security.md,
 * "The socket's group locking QEMU out"). Legacy requests are not counted.
 */

/** v2 requests answered per turn of the event loop, all connections together. */
const V2_REQUESTS_PER_TURN = 256;

let spent = 0;
let resetQueued = false;

/** Takes one request from this turn's budget: false when it is spent (go on in the next turn). */
export function takeRequestTurn(): boolean {
  if (!resetQueued) {
    resetQueued = true;
    // Queued before the connections that run out, so they find a fresh budget when their turn comes.
    setImmediate(() => {
      spent = 0;
      resetQueued = false;
    });
  }
  if (spent >= V2_REQUESTS_PER_TURN) return false;
  spent++;
  return true;
}
