/** SIGINT and SIGTERM end a foreground command (watch, stats, record, exporter). */
import { DisposableStore, listen, type Disposable } from '../common/disposable.js';

type Line = (line: string) => void;

/** Runs `stop` on SIGINT or SIGTERM; disposing removes both listeners. */
export function onStopSignals(stop: () => void): Disposable {
  const store = new DisposableStore();
  for (const sig of ['SIGINT', 'SIGTERM']) store.add(listen(process, sig, () => stop()));
  return store;
}

/** A live command: its lines to stdout, its warnings to stderr, until SIGINT or SIGTERM aborts it. */
export async function runUntilStopped(run: (out: Line, signal: AbortSignal, warn: Line) => Promise<void>): Promise<void> {
  const ac = new AbortController();
  const signals = onStopSignals(() => ac.abort());
  const write = (to: NodeJS.WriteStream) => (l: string) => void to.write(`${l}\n`);
  await run(write(process.stdout), ac.signal, write(process.stderr)).finally(() => signals.dispose());
}
