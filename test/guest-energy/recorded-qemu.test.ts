/**
 * The model against QEMU 10.0.2 itself: windows of its vmsr thread recorded with strace
 * (test/fixtures/qemu-vmsr/qemu-10.0.2-windows.json: the stat lines it read, the values it was
 * answered) replayed through the model give, window after window, the MSR_PKG_ENERGY_STATUS values
 * the real guest printed.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { freshLoopState, qemuEnergyDelta, runIteration, type LoopThread } from '../../src/guest-energy/qemu-vmsr-loop.js';

interface Recorded {
  clkTck: number;
  packageCpus: number;
  windows: { eStart: number; eEnd: number; threads: { tid: number; comm: string; cpu: number; ticks0: number; ticks1: number | null }[] }[];
  guestLines: number[];
}

const FIXTURE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../fixtures/qemu-vmsr/qemu-10.0.2-windows.json');

describe('the model of the vmsr loop against a recording of QEMU 10.0.2', () => {
  it('gives, window after window, the values the guest printed', () => {
    const rec = JSON.parse(fs.readFileSync(FIXTURE, 'utf8')) as Recorded;
    const maxTicks = new Map([[0, rec.clkTck * rec.packageCpus]]);
    const windows = rec.windows.map((w) => ({
      eDelta: new Map([[0, qemuEnergyDelta(BigInt(w.eStart), BigInt(w.eEnd))]]),
      threads: w.threads.map((t): LoopThread => ({
        tid: t.tid,
        pkg: 0,
        ticks0: t.ticks0,
        ticks1: t.ticks1,
        ...(/^CPU \d+\/KVM$/.test(t.comm) ? { vpkg: 0 } : {}),
      })),
    }));
    // The recording starts mid-run: the guest's value before the first window is the printed line
    // that the first window's credit leads to the next one from.
    const first = runIteration(freshLoopState(1), { ...windows[0]!, maxTicks })[0]!;
    const at = rec.guestLines.findIndex((v, i) => rec.guestLines[i + 1] === v + Number(first));
    expect(at, "the first window's credit joins two printed values").toBeGreaterThanOrEqual(0);
    const s = freshLoopState(1);
    s.vpkgCounter[0] = rec.guestLines[at]!;
    const modelled: number[] = [];
    for (const w of windows) {
      const before: number = s.vpkgCounter[0]!;
      runIteration(s, { ...w, maxTicks });
      if (s.vpkgCounter[0] !== before) modelled.push(s.vpkgCounter[0]!);
    }
    expect(modelled.length).toBeGreaterThan(8);
    expect(modelled).toEqual(rec.guestLines.slice(at + 1, at + 1 + modelled.length));
  });
});
