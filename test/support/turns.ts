/** Counts the turns of this process's event loop (one setImmediate a turn), so a test can say in which turn something ran. */
export function countTurns(): { now(): number; stop(): void } {
  let turn = 0;
  let ticking = true;
  const tick = () => {
    turn++;
    if (ticking) setImmediate(tick);
  };
  setImmediate(tick);
  return { now: () => turn, stop: () => (ticking = false) };
}
