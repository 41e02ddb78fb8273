/**
 * A package energy counter that runs at a known rate: every `periodMs` the FakeHost's counter is
 * set to start + floor(rate x elapsed), so late timers never lose energy, they only delay it. The
 * longest pause between two writes is measured (`maxGapS`), because a reader sampling the counter
 * can be off by rate x that pause.
 */
import type { FakeHost } from './fake-host.js';

export class EnergyPump {
  private timer: NodeJS.Timeout | null = null;
  private t0 = 0;
  private last = 0;
  maxGapS = 0;

  constructor(
    private readonly host: FakeHost,
    private readonly o: { pkg?: number; msr: number; start: number; unitsPerSecond: number; periodMs?: number },
  ) {}

  /** The counter value for now, as the next write will set it. */
  value(at = performance.now()): number {
    return (this.o.start + Math.floor(((at - this.t0) / 1000) * this.o.unitsPerSecond)) >>> 0;
  }

  start(): void {
    this.t0 = this.last = performance.now();
    this.timer = setInterval(() => {
      const now = performance.now();
      this.maxGapS = Math.max(this.maxGapS, (now - this.last) / 1000);
      this.last = now;
      this.host.writePackageCounter32(this.o.pkg ?? 0, this.o.msr, this.value(now));
    }, this.o.periodMs ?? 20);
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
}
