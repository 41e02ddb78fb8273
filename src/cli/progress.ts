/** A progress line on stderr: rewritten in place on a terminal (at most every 200 ms), elsewhere a line at the caller's milestones. */
export class ProgressLine {
  readonly tty: boolean;
  private lastDraw = 0;
  private shown = false;

  constructor(
    private readonly out: NodeJS.WritableStream & { isTTY?: boolean } = process.stderr,
    private readonly now: () => number = () => Date.now(),
  ) {
    this.tty = out.isTTY === true;
  }

  show(text: string, milestone: boolean): void {
    if (this.tty) {
      const t = this.now();
      if (!milestone && t - this.lastDraw < 200) return;
      this.lastDraw = t;
      this.out.write(`\r${text}\x1b[K`);
      this.shown = true;
    } else if (milestone) {
      this.out.write(`${text}\n`);
    }
  }

  /** The final line, always written (on a terminal it replaces the progress line). */
  done(text: string): void {
    this.out.write(this.tty ? `\r${text}\x1b[K\n` : `${text}\n`);
    this.shown = false;
  }

  /** Removes the progress line from a terminal, e.g. before printing a table or an error. */
  clear(): void {
    if (this.tty && this.shown) this.out.write('\r\x1b[K');
    this.shown = false;
  }
}
