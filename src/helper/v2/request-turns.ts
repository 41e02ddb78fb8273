/**
 * How many v2 requests the daemon answers, all connections together, in one turn of the event loop
 * before it lets the loop go round (docs/security.md, "The socket's group locking QEMU out"). Node
 * accepts one new connection per turn of its loop, and reads every readable connection in it: a
 * client pipelining thousands of requests in each read (STATS_FD, LIST, ...) over many connections
 * made every turn tens of ms long, so new connections, QEMU's among them, waited in the listen
 * backlog for seconds. A connection past the turn's budget is paused and goes on in the next turn
 * (V2Connection.drain); QEMU's legacy requests are not counted.
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
