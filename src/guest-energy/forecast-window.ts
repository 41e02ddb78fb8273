/**
 * A window's end answered from a forecast, before its threads are read (docs/guest-energy.md, "Settling
 * after the reply"): from upper bounds of the ticks, so the credit errs low; settleWindow carries the error.
 */
import { advanceCounters, takeAttributed, type GuestCounterState, type WindowEnd } from './guest-counter.js';

/** ticks1: the forecast ticks at the window's end. */
export interface VcpuForecast {
  pkg: number;
  ticks0: number;
  ticks1: number;
}

/** otherTicks: at least the ticks of the non-vCPU threads QEMU listed, over the window. */
type ForecastInput = WindowEnd & { vcpus: readonly VcpuForecast[]; otherTicks: number };

/** Per package: the forecast vCPU ticks, the vCPUs that ran, and every vCPU that sat on it. */
function perPackage(vcpus: readonly VcpuForecast[]) {
  const out = new Map<number, { ticks: number; ran: number; vcpus: number }>();
  for (const v of vcpus) {
    let f = out.get(v.pkg);
    if (f === undefined) out.set(v.pkg, (f = { ticks: 0, ran: 0, vcpus: 0 }));
    f.vcpus++;
    const d = v.ticks1 - v.ticks0;
    if (d > 0) {
      f.ticks += d;
      f.ran++;
    }
  }
  return out;
}

/** closeWindow from a forecast; the e_delta answered is kept in `s.answered` for settleWindow. */
export function answerForecast(s: GuestCounterState, o: ForecastInput): number {
  takeAttributed(s, o.exactJ, o.unitJ);
  const fc = perPackage(o.vcpus);
  // QEMU's credit from package p, linear in e: e x (V + ran x O / nb) / maxticks + ran x C / nb, with
  // V the vCPU ticks, O the non-vCPU ticks, C the carried share and nb the vCPU count after this window.
  const slope = new Map<number, number>();
  let base = 0;
  let ticks = 0;
  for (const p of s.phases.pkgs) {
    const f = fc.get(p);
    if (f === undefined || f.ran === 0) continue;
    const nb = (s.loop.nbVcpu.get(p) ?? 0) + f.vcpus;
    base += f.ran * Math.floor(Number(s.loop.eRatio.get(p) ?? 0n) / nb);
    slope.set(p, (f.ticks + (f.ran * o.otherTicks) / nb) / (o.maxTicks.get(p) ?? 1));
    ticks += f.ticks;
  }
  // Split between the packages by their vCPU ticks, as solveWindow does.
  const target = Math.max(0, Math.floor(s.owedUnits) - base);
  const eDelta = new Map<number, bigint>();
  for (const p of s.phases.pkgs) {
    const k = slope.get(p);
    const e = k === undefined || s.start === null || o.zero === true ? 0 : Math.floor((target * fc.get(p)!.ticks) / ticks / k);
    eDelta.set(p, BigInt(Math.max(0, e)));
  }
  advanceCounters(s, eDelta);
  s.answered = eDelta;
  return s.counters.get(o.pkg) ?? 0;
}
