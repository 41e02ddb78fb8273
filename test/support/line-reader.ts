/** Lines a child process writes on stdout, awaited one at a time (the test helpers' command replies). */
import type { ChildProcess } from 'node:child_process';

export class LineReader {
  private lines: string[] = [];
  private waiters: (() => void)[] = [];

  constructor(private readonly child: ChildProcess) {
    let buf = '';
    child.stdout!.setEncoding('utf8');
    child.stdout!.on('data', (d: string) => {
      buf += d;
      let i: number;
      while ((i = buf.indexOf('\n')) >= 0) {
        this.lines.push(buf.slice(0, i));
        buf = buf.slice(i + 1);
        for (const w of this.waiters.splice(0)) w();
      }
    });
  }

  /** The next line; rejects when the child has exited with nothing left to read. */
  async next(): Promise<string> {
    while (this.lines.length === 0) {
      if (this.child.exitCode !== null || this.child.signalCode !== null) throw new Error('the child process exited');
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, 100);
      });
    }
    return this.lines.shift()!;
  }
}
