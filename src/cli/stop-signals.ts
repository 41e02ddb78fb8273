/** SIGINT and SIGTERM end a foreground command (watch, stats, record, exporter). */
import { DisposableStore, listen, type Disposable } from '../common/disposable.js';

type Line = (line: string) => void;

/** Runs `stop` on SIGINT or SIGTERM, given the signal as emitted (cli.ts emits SIGTERM as 'SIGPIPE' when stdout closed). */
export function onStopSignals(stop: (signal: string) => void): Disposable {
  const store = new DisposableStore();
  for (const sig of ['SIGINT', 'SIGTERM']) store.add(listen(process, sig, (emitted: string) => stop(emitted)));
  return store;
}

/** A live command: its lines to stdout, its warnings to stderr, until SIGINT or SIGTERM aborts it. */
export async function runUntilStopped(run: (out: Line, signal: AbortSignal, warn: Line) => Promise<void>): Promise<void> {
  const ac = new AbortController();
  const signals = onStopSignals(() => ac.abort());
  const write = (to: NodeJS.WriteStream) => (l: string) => void to.write(`${l}\n`);
  await run(write(process.stdout), ac.signal, write(process.stderr)).finally(() => signals.dispose());
}
