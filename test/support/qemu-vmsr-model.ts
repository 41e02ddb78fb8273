/**
 * What stock QEMU (9.1 to 10.x) puts in a guest's MSR_PKG_ENERGY_STATUS, turned into bounds a test
 * can check against the guest's printed 0x611 values. Read from target/i386/kvm/kvm.c
 * (kvm_msr_energy_thread) and target/i386/kvm/vmsr_energy.c, QEMU 10.0:
 *
 * - QEMU's "kvm-msr" thread loops: read every QEMU thread's utime+stime from /proc, ask the helper
 *   for 0x611 (e_start), sleep 1 s, ask again (e_end), read the ticks again. e_delta = e_end -
 *   e_start when e_end > e_start, else 0 (a wrapped or failed read gives that period nothing).
 * - maxticks = CLK_TCK x (host CPUs in that package), i.e. the ticks the package can give in 1 s.
 * - a vCPU thread's share = e_delta x ticks / maxticks (vmsr_get_ratio), rounded.
 * - the other QEMU threads' shares are summed into e_ratio, which is divided by the package's vCPU
 *   count and added to each vCPU that ran. (e_ratio and the vCPU count are never reset between
 *   periods, so this term is at most the non-vCPU threads' share and shrinks as QEMU runs.)
 * - the guest's counter is the running sum of those increments, per virtual package; it changes only
 *   at the end of a period, so a guest read sees the total up to QEMU's last finished period.
 *
 * So over a span of the test [A, B] in which the test's package counter grows at `rate` units/s,
 * the guest's growth G is the sum over QEMU periods finished in (A, B] of
 * rate x w x ticks / maxticks, where w is the period's real length. Bounds, each term explained:
 *
 *   low  = rate / maxticks x (V - CLK_TCK x SLACK) x (1 - gap)
 *   high = rate / maxticks x (V + N + CLK_TCK x SLACK) x (STRETCH + gap) + periods
 *
 * - V, N: vCPU and other-thread ticks the test reads from /proc over [A, B] (QEMU reads the same).
 * - SLACK: QEMU's periods do not line up with [A, B]; the periods finished in it start up to one
 *   period before A and end up to one period before B. One thread runs at most CLK_TCK ticks per
 *   second, so the misalignment is worth at most CLK_TCK x SLACK ticks, SLACK = one period plus
 *   QEMU's own overhead (1.5 s, generous on a loaded 2-core machine).
 * - STRETCH: QEMU assumes its 1 s sleep lasts 1 s; on a loaded host it lasts longer, e_delta grows
 *   with it and so do the ticks. 1.25 allows a quarter-second late wake-up every period.
 * - gap: the test's counter is written every few ms; the longest pause between writes (measured)
 *   makes a period's e_delta short or long by up to rate x gap.
 * - periods: QEMU rounds each increment (lround), at most 1 unit each.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

/** One QEMU period (1 s sleep) plus its overhead, seconds. */
export const QEMU_PERIOD_SLACK_S = 1.5;
/** Longest a 1 s sleep of QEMU's vmsr thread may last on a loaded test machine, relative. */
export const QEMU_PERIOD_STRETCH = 1.25;

export interface GrowthInputs {
  /** Units per second the test's package counter grows. */
  rate: number;
  /** Ticks of the vCPU thread(s) and of QEMU's other threads over the span. */
  vcpuTicks: number;
  otherTicks: number;
  spanS: number;
  /** Longest pause between the test's counter writes, seconds. */
  writerGapS: number;
  clkTck: number;
  /** QEMU's maxticks: CLK_TCK x CPUs in the host package. */
  maxTicks: number;
}

/** The range QEMU's algorithm allows for the guest counter's growth over the span. */
export function guestGrowthBounds(i: GrowthInputs): { low: number; high: number; expected: number } {
  const perTick = i.rate / i.maxTicks;
  const slackTicks = i.clkTck * QEMU_PERIOD_SLACK_S;
  const periods = Math.ceil(i.spanS) + 2;
  return {
    low: perTick * Math.max(0, i.vcpuTicks - slackTicks) * Math.max(0, 1 - i.writerGapS),
    high: perTick * (i.vcpuTicks + i.otherTicks + slackTicks) * (QEMU_PERIOD_STRETCH + i.writerGapS) + periods,
    expected: perTick * i.vcpuTicks,
  };
}

/** sysconf(_SC_CLK_TCK), the unit of /proc ticks. */
export function clockTicksPerSecond(): number {
  const v = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim());
  if (!Number.isSafeInteger(v) || v <= 0) throw new Error(`getconf CLK_TCK gave ${v}`);
  return v;
}

/**
 * QEMU's maxticks for host package `pkg`: CLK_TCK x the CPUs whose physical_package_id is `pkg`
 * in the REAL sysfs (QEMU reads /sys/devices/system/cpu itself, whatever the helper is told).
 */
export function qemuMaxTicks(pkg = 0, sysCpu = '/sys/devices/system/cpu'): number {
  let n = 0;
  for (const d of fs.readdirSync(sysCpu)) {
    if (!/^cpu\d+$/.test(d)) continue;
    try {
      if (Number(fs.readFileSync(path.join(sysCpu, d, 'topology/physical_package_id'), 'utf8').trim()) === pkg) n++;
    } catch {
      /* no topology: QEMU stops counting there too */
    }
  }
  if (n === 0) throw new Error(`no CPU of package ${pkg} in ${sysCpu}`);
  return clockTicksPerSecond() * n;
}
