/**
 * THE feedback rule of a VM's power limit (docs/power-limits.md "The loop"), pure: from the power the
 * engine attributed to the VM over the last interval and the CPU bandwidth in force, the bandwidth for
 * the next interval. One step per sample; no clock, no files.
 *
 * A VM's attributed power grows faster than linearly with its CPU time (its share of the package times
 * the package's power, which itself follows the load): locally P ~ c^a with a between 1 and 2. The step
 * is multiplicative, c' = c x (limit / P)^(1/A) with A = 1.5, the middle of that range: it lands in one
 * step when a = 1.5 and shrinks the error by at least 3 each step anywhere in [1, 2], never swinging
 * past the limit by more than a third of the error it corrects. Errors within DEADBAND are noise and
 * change nothing, so a steady VM's quota stands still.
 */

export const POWER_CONTROL = {
  /** The assumed local exponent of power over CPU time (1/A is the step's exponent). */
  exponent: 1.5,
  /** A step whose power is off the limit by more than this factor is taken with the exponent 2 (stepExponent). */
  largeStep: 1.25,
  /** Relative errors smaller than this change nothing (the noise of a busy host's attribution). */
  deadband: 0.02,
  /** The floor: this many CPUs per vCPU are never taken away (docs/power-limits.md "The floor"). */
  floorPerVcpu: 0.05,
} as const;

/** What one step is given. */
interface ControlInput {
  limitW: number;
  /** The VM's attributed package power over the last interval. */
  powerW: number;
  /** CPUs the VM's vCPU threads used over the last interval (their ticks / CLK_TCK / dt). */
  usedCpus: number;
  nvcpu: number;
  /** The helper's bandwidth in force, in CPUs; null while it sets none (the VM is under its limit). */
  quotaCpus: number | null;
}

/** The floor, in CPUs, of a VM of `nvcpu` vCPUs. */
export function floorCpus(nvcpu: number): number {
  return POWER_CONTROL.floorPerVcpu * Math.max(1, nvcpu);
}

/**
 * The bandwidth for the next interval, in CPUs, or null for none (let go: the VM stays under its limit
 * with every CPU it has). Nothing is set while the VM stays under its limit.
 */
export function nextQuota(i: ControlInput): number | null {
  const full = Math.max(1, i.nvcpu);
  if (!(i.powerW > 0) || !Number.isFinite(i.powerW) || !(i.limitW > 0)) return i.quotaCpus;
  const ratio = i.limitW / i.powerW;
  if (i.quotaCpus === null) {
    if (ratio >= 1) return null;
    return clamp(Math.max(i.usedCpus, floorCpus(i.nvcpu)) * ratio ** (1 / stepExponent(ratio)), i.nvcpu);
  }
  if (Math.abs(Math.log(ratio)) < POWER_CONTROL.deadband) return i.quotaCpus;
  // A VM that used far less than its quota (it went idle, or the host kept it from running) is
  // steered from what it used, so the quota does not wind up where it has no effect.
  const base = ratio > 1 ? i.quotaCpus : Math.min(i.quotaCpus, Math.max(i.usedCpus, floorCpus(i.nvcpu)));
  const next = base * ratio ** (1 / stepExponent(ratio));
  return next >= full ? null : clamp(next, i.nvcpu);
}

/**
 * The exponent of one step: A, or for a large step (power more than a quarter off the limit) the top
 * of the range, 2, so that a VM whose power grows like c^2 is not carried past the limit (at A = 1.5 a
 * step to half its power would land 18 % below); the next, smaller step then lands with A.
 */
function stepExponent(ratio: number): number {
  return Math.abs(Math.log(ratio)) > Math.log(POWER_CONTROL.largeStep) ? 2 : POWER_CONTROL.exponent;
}

function clamp(cpus: number, nvcpu: number): number {
  return Math.min(Math.max(1, nvcpu), Math.max(floorCpus(nvcpu), cpus));
}
