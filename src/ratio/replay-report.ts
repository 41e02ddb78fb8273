/** Replay output: the JSON lines of docs/trace-format.md "Replay output" and a human table. */
import { formatMsrHex } from './counter.js';
import type { ReplaySummary } from './trace-replay.js';
import type { IntervalResult, VmOutput } from './outputs.js';

/** Per domain name, the fields `f` gives; undefined when there are none, so that the key is left out. */
function byDomain<T extends { domain: string }>(list: readonly T[] | undefined, f: (d: T) => Record<string, unknown>) {
  if (list === undefined || list.length === 0) return undefined;
  const out: Record<string, Record<string, unknown>> = {};
  for (const d of list) out[d.domain] = f(d);
  return out;
}

/** t_ns can pass 2^53 on a long-running host: written as a bare integer token, never rounded. */
export function intervalJsonLine(r: IntervalResult): string {
  const rest = {
    dt_s: r.dtS,
    packages: r.packages.map((p) => ({
      package: p.pkg,
      energy_j: p.energyJ,
      attributed_j: p.attributedJ,
      domains: byDomain(p.domains, (d) => ({ energy_j: d.energyJ, attributed_j: d.attributedJ })),
    })),
    vms: r.vms.map((v) => ({
      pid: v.pid,
      vpkgs: v.vpkgEnergyJ.map((e, g) => ({ vpkg: g, energy_j: e, domains: byDomain(v.domains, (d) => ({ energy_j: d.vpkgEnergyJ[g] })) })),
    })),
  };
  return `{"type":"interval","t_ns":${String(r.tNs)},${JSON.stringify(rest).slice(1)}`;
}

export function totalJsonLine(outputs: VmOutput[]): string {
  return JSON.stringify({
    type: 'total',
    vms: outputs.map((o) => ({
      pid: o.pid,
      name: o.name ?? null,
      ended: o.ended,
      vpkgs: o.vpkgs.map((v, g) => ({
        vpkg: v.vpkg,
        energy_uj: v.energyUj.toString(),
        counter: formatMsrHex(v.counter),
        domains: byDomain(o.domains, (d) => ({ energy_uj: d.vpkgEnergyUj[g]!.toString() })),
      })),
    })),
  });
}

function pad(cells: string[][], rightAlign: boolean[]): string {
  const widths = cells[0]!.map((_, c) => Math.max(...cells.map((row) => row[c]!.length)));
  return cells
    .map((row) =>
      row
        .map((cell, c) => (rightAlign[c] ? cell.padStart(widths[c]!) : cell.padEnd(widths[c]!)))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

/** Control characters in VM names (from an untrusted trace) must not drive the terminal. */
function printable(text: string): string {
  return text.replace(/[\u0000-\u001f\u007f-\u009f]/g, '?');
}

/** Per VM and virtual package: joules, average watts over the VM's attributed time, ended or not. */
export function formatTable(s: ReplaySummary): string {
  const lines: string[] = [];
  const note = s.header.note ? `  (${printable(s.header.note)})` : '';
  lines.push(`${s.samples} samples, ${s.intervals} intervals${note}`);
  const on = s.header.hostname ? ` on ${printable(s.header.hostname)}` : '';
  const from = s.header.startTime ? ` from ${printable(s.header.startTime)}` : '';
  if (on || from) lines.push(`recorded${on}${from}`);
  if (s.vms.length === 0) {
    lines.push('no VM was registered in this trace');
    return lines.join('\n') + '\n';
  }
  // A trace with other RAPL domains gets a column of joules for each, after the package's.
  const domains = [...new Set((s.header.host.domains ?? []).map((d) => d.domain))];
  const domainCols = domains.map((d) => `${d.toUpperCase()} J`);
  const rows: string[][] = [['VM', 'PID', 'STATE', 'VPKG', 'JOULES', 'AVG W', 'OVER S', ...domainCols]];
  for (const { output, attributedS } of s.vms) {
    const name = printable(output.name ?? '(unnamed)');
    const state = stateOf(output);
    if (output.vpkgs.length === 0)
      rows.push([name, String(output.pid), state, '-', '-', '-', attributedS.toFixed(1), ...domains.map(() => '-')]);
    for (const v of output.vpkgs) {
      const watts = attributedS > 0 ? (v.energyJ / attributedS).toFixed(2) : '-';
      const perDomain = domains.map((d) => output.domains?.find((x) => x.domain === d)?.vpkgEnergyJ[v.vpkg]?.toFixed(3) ?? '-');
      rows.push([name, String(output.pid), state, String(v.vpkg), v.energyJ.toFixed(3), watts, attributedS.toFixed(1), ...perDomain]);
    }
  }
  lines.push(pad(rows, [false, true, false, true, true, true, true, ...domains.map(() => true)]));
  if (domains.length > 0) lines.push(`JOULES and AVG W are the package domain's; ${domainCols.join(', ')}: the joules of that RAPL domain`);
  return lines.join('\n') + '\n';
}

/** running; ended (its process went away); unregistered (its client withdrew it, the VM may run on). */
export function stateOf(o: VmOutput): 'running' | 'ended' | 'unregistered' {
  if (!o.ended) return 'running';
  return o.endedBy === 'unregister' ? 'unregistered' : 'ended';
}

/** The stderr note about stat lines and records the engine could not use. */
export function formatProblems(s: ReplaySummary): string {
  if (s.problems.count === 0) return '';
  const head = `${s.problems.count} problem(s) in the trace were skipped (not fatal)${s.problems.count > s.problems.first.length ? `; the first ${s.problems.first.length}` : ''}:`;
  return [head, ...s.problems.first.map((p) => `  ${printable(p.length > 300 ? `${p.slice(0, 297)}...` : p)}`)].join('\n') + '\n';
}
