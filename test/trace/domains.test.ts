/**
 * Traces with other RAPL domains (docs/trace-format.md): the header's host.domains and a sample's
 * domains, written and read back as they were, replayed to the engine's own numbers (a domain
 * missing from some samples included), hostile domain fields refused with their line, and a
 * trace without domains read and replayed exactly as before.
 */
import { Readable } from 'node:stream';
import { describe, expect, test } from 'vitest';
import { RatioEngine } from '../../src/ratio/attribution.js';
import { formatTable, intervalJsonLine, totalJsonLine } from '../../src/ratio/replay-report.js';
import { replayRecords } from '../../src/ratio/trace-replay.js';
import { TraceError, type TraceRecord } from '../../src/ratio/trace-records.js';
import type { DomainCounter, HostInfo } from '../../src/model/host.js';
import type { Sample, TraceHeader } from '../../src/model/sample.js';
import type { VmSpec } from '../../src/model/vm.js';
import { readTraceStream } from '../../src/trace/reader.js';
import { headerLine, registerLine, sampleLine } from '../../src/trace/writer.js';
import { host, statLine, units } from '../ratio/helpers.js';

/** Two packages of one CPU each, with core and DRAM on both and psys under package 0. */
const COUNTERS: DomainCounter[] = [
  { pkg: 0, domain: 'core', range: 1n << 32n, unitJ: 2 ** -14 },
  { pkg: 1, domain: 'core', range: 1n << 32n, unitJ: 2 ** -14 },
  { pkg: 0, domain: 'dram', range: 1n << 32n, unitJ: 15.3e-6 },
  { pkg: 1, domain: 'dram', range: 1n << 32n, unitJ: 15.3e-6 },
  { pkg: 0, domain: 'psys', range: 262_143_328_851n, unitJ: 1e-6 },
];
const HOST: HostInfo = { ...host([1, 1]), domains: COUNTERS };

const VMS: VmSpec[] = [
  {
    pid: 10,
    starttime: 5,
    name: 'a',
    vcpus: [
      { tid: 11, vpkg: 0 },
      { tid: 12, vpkg: 1 },
    ],
  },
  { pid: 20, starttime: 5, name: 'b', vcpus: [{ tid: 21, vpkg: 0 }] },
];

/**
 * Sample k: VM a's vCPU 11 runs on CPU 0, 12 on CPU 1, VM b's 21 on CPU 1, its main thread on CPU 0;
 * every counter moves by its own amount, DRAM's wraps. `drop` leaves out readings ("dram 1").
 */
function sampleAt(k: number, drop: string[] = []): Sample {
  const line = (tid: number, ticks: number, cpu: number) => statLine({ tid, utime: ticks, starttime: 5, processor: cpu });
  const raw: Record<string, bigint> = {
    'core 0': BigInt(1000 + 70_000 * k),
    'core 1': BigInt(2000 + 50_000 * k),
    'dram 0': BigInt((0xffff_c000 + 9000 * k) % 2 ** 32),
    'dram 1': BigInt((0xffff_8000 + 13_000 * k) % 2 ** 32),
    'psys 0': BigInt(262_143_000_000 + 2_000_000 * k) % 262_143_328_851n,
  };
  return {
    tNs: BigInt(k) * 1_000_000_000n + 7n,
    energy: new Map([
      [0, units(1000 + 40 * k)],
      [1, units(500 + 25 * k)],
    ]),
    tasks: new Map([
      [
        10,
        new Map([
          [10, line(10, 3 * k, 0)],
          [11, line(11, 60 * k, 0)],
          [12, line(12, 20 * k, 1)],
        ]),
      ],
      [
        20,
        new Map([
          [20, line(20, 5 * k, 0)],
          [21, line(21, 45 * k, 1)],
        ]),
      ],
    ]),
    domains: Object.entries(raw)
      .filter(([key]) => !drop.includes(key))
      .map(([key, v]) => {
        const [domain, pkg] = key.split(' ');
        return { domain: domain as DomainCounter['domain'], pkg: Number(pkg), raw: v };
      }),
  };
}

const SAMPLES = [0, 1, 2, 3, 4, 5].map((k) => sampleAt(k, k === 2 || k === 3 ? ['dram 1'] : []));

function traceText(header: TraceHeader, samples: Sample[]): string {
  return [headerLine(header), ...VMS.map((vm) => registerLine(1n, vm)), ...samples.map(sampleLine)].join('');
}

function records(text: string): AsyncGenerator<TraceRecord> {
  return readTraceStream(Readable.from([Buffer.from(text)]));
}

async function collect(text: string): Promise<TraceRecord[]> {
  const out: TraceRecord[] = [];
  for await (const r of records(text)) out.push(r);
  return out;
}

async function replayLines(text: string) {
  const lines: string[] = [];
  const summary = await replayRecords(records(text), (r) => lines.push(intervalJsonLine(r)));
  lines.push(totalJsonLine(summary.vms.map((v) => v.output)));
  return { summary, lines };
}

async function refusal(text: string): Promise<string> {
  try {
    await replayRecords(records(text));
  } catch (e) {
    expect(e).toBeInstanceOf(TraceError);
    return `line ${(e as TraceError).line}: ${(e as TraceError).reason}`;
  }
  throw new Error('expected the trace to be refused');
}

const headerJson = (hostPatch: Record<string, unknown>) =>
  JSON.stringify({
    type: 'header',
    format: 'vmsr-trace',
    version: 1,
    clk_tck: 100,
    host: {
      vendor: 'intel',
      cpus: [
        { cpu: 0, package: 0 },
        { cpu: 1, package: 1 },
      ],
      packages: [
        { package: 0, power_unit: '0xa0e03' },
        { package: 1, power_unit: '0xa0e03' },
      ],
      ...hostPatch,
    },
  }) + '\n';
const DRAM0 = { package: 0, domain: 'dram', range: '0x100000000', unit_j: 1.53e-5 };
const sampleJson = (domains: unknown) =>
  `{"type":"sample","t_ns":5,"energy":{"0":"0x1","1":"0x1"},"domains":${JSON.stringify(domains)},"tasks":{}}\n`;

describe('trace domains: written and read', () => {
  test('the writer writes host.domains and each sample domains as raw hex by domain and package, and the reader gives them back as they were', async () => {
    const text = traceText({ host: HOST }, SAMPLES);
    const first = text.split('\n')[0]!;
    expect(JSON.parse(first).host.domains).toEqual([
      { package: 0, domain: 'core', range: '0x100000000', unit_j: 2 ** -14 },
      { package: 1, domain: 'core', range: '0x100000000', unit_j: 2 ** -14 },
      { package: 0, domain: 'dram', range: '0x100000000', unit_j: 15.3e-6 },
      { package: 1, domain: 'dram', range: '0x100000000', unit_j: 15.3e-6 },
      { package: 0, domain: 'psys', range: `0x${(262_143_328_851).toString(16)}`, unit_j: 1e-6 },
    ]);
    const third = JSON.parse(sampleLine(SAMPLES[3]!)) as { domains: Record<string, Record<string, string>> };
    const hex = (n: number | bigint) => `0x${n.toString(16)}`;
    expect(third.domains).toEqual({
      core: { '0': hex(1000 + 70_000 * 3), '1': hex(2000 + 50_000 * 3) },
      dram: { '0': hex(0xffff_c000 + 9000 * 3 - 2 ** 32) }, // wrapped; dram 1 is left out of this sample
      psys: { '0': hex((262_143_000_000n + 6_000_000n) % 262_143_328_851n) },
    });
    const recs = await collect(text);
    const h = recs[0]!;
    expect(h.type === 'header' && h.header.host).toEqual(HOST);
    const samples = recs.filter((r) => r.type === 'sample').map((r) => (r.type === 'sample' ? r.sample : null));
    expect(samples.map((s) => new Set(s!.domains!.map((d) => `${d.domain} ${d.pkg} ${d.raw}`)))).toEqual(
      SAMPLES.map((s) => new Set(s.domains!.map((d) => `${d.domain} ${d.pkg} ${d.raw}`))),
    );
  });

  test('a trace of the package alone has no domains key anywhere, and reads with none', async () => {
    const plain = SAMPLES.map(({ domains: _, ...s }) => s);
    const text = traceText({ host: host([1, 1]) }, plain);
    expect(text).not.toContain('domains');
    const recs = await collect(text);
    expect(recs[0]!.type === 'header' && recs[0]!.header.host.domains).toBeUndefined();
    expect(recs.some((r) => r.type === 'sample' && r.sample.domains !== undefined)).toBe(false);
  });
});

describe('trace domains: replay', () => {
  test('replays to the totals the engine gives the same samples live, a domain missing from two samples spanned by its next value', async () => {
    const live = new RatioEngine(HOST);
    const ids = VMS.map((vm) => live.register(vm));
    for (const s of SAMPLES) live.addSample(s);
    const { summary } = await replayLines(traceText({ host: HOST }, SAMPLES));
    expect(summary.vms.map((v) => v.output)).toEqual(ids.map((id) => live.output(id)));
    const dram = summary.vms[0]!.output.domains!.find((d) => d.domain === 'dram')!;
    expect(dram.vpkgEnergyJ[1]).toBeGreaterThan(0); // VM a's vCPU on package 1 got DRAM energy
    expect(summary.problems.first).toEqual([
      expect.stringMatching(/^line 6: no dram energy value for package 1 in this sample$/),
      expect.stringMatching(/^line 7: no dram energy value for package 1 in this sample$/),
    ]);
    // Package 1's DRAM over the whole trace: what its counter moved, attributed once it was read again.
    const total = (text: string) =>
      replayLines(text).then((r) => r.summary.vms.map((v) => v.output.domains!.find((d) => d.domain === 'dram')!));
    const everySample = await total(
      traceText(
        { host: HOST },
        [0, 1, 2, 3, 4, 5].map((k) => sampleAt(k)),
      ),
    );
    const sumJ = (d: { vpkgEnergyJ: number[] }[]) => d.flatMap((x) => x.vpkgEnergyJ).reduce((a, b) => a + b, 0);
    // The same CPU shares every interval here, so spanning the gap gives what reading it each time gives.
    expect(sumJ([dram])).toBeGreaterThan(0);
    expect(sumJ(await total(traceText({ host: HOST }, SAMPLES)))).toBeCloseTo(sumJ(everySample), 9);
  });

  test('replay --json gives per-package domain energy and attributed, per-VM per-vpkg domain energy, and exact domain totals', async () => {
    const { summary, lines } = await replayLines(traceText({ host: HOST }, SAMPLES));
    const interval = JSON.parse(lines[0]!) as {
      packages: { package: number; domains: Record<string, { energy_j: number; attributed_j: number }> }[];
      vms: { pid: number; vpkgs: { vpkg: number; energy_j: number; domains: Record<string, { energy_j: number }> }[] }[];
    };
    expect(Object.keys(interval.packages[0]!.domains)).toEqual(['core', 'dram', 'psys']);
    expect(Object.keys(interval.packages[1]!.domains)).toEqual(['core', 'dram']); // psys is reported under package 0
    expect(interval.packages[1]!.domains.core!.energy_j).toBeCloseTo(50_000 * 2 ** -14, 9);
    expect(interval.packages[0]!.domains.dram!.energy_j).toBeCloseTo(9000 * 15.3e-6, 12);
    expect(interval.packages[0]!.domains.psys!.energy_j).toBeCloseTo(2, 9);
    expect(interval.vms.map((v) => v.vpkgs.map((g) => Object.keys(g.domains)))).toEqual([
      [
        ['core', 'dram', 'psys'],
        ['core', 'dram', 'psys'],
      ],
      [['core', 'dram', 'psys']],
    ]);
    // What went to VMs on a package is its attributed part: the vCPUs' and the main threads' shares.
    const core1 = interval.vms.flatMap((v) => v.vpkgs.map((g) => g.domains.core!.energy_j)).reduce((a, b) => a + b, 0);
    const attributed = interval.packages.reduce((a, p) => a + p.domains.core!.attributed_j, 0);
    expect(core1).toBeCloseTo(attributed, 9);
    // An interval in which package 1's DRAM was not read leaves it out.
    const gapInterval = JSON.parse(lines[1]!) as { packages: { domains: Record<string, unknown> }[] };
    expect(Object.keys(gapInterval.packages[1]!.domains)).toEqual(['core']);
    const total = JSON.parse(lines.at(-1)!) as { vms: { vpkgs: { domains: Record<string, { energy_uj: string }> }[] }[] };
    const out = summary.vms[0]!.output;
    expect(total.vms[0]!.vpkgs[1]!.domains).toEqual({
      core: { energy_uj: out.domains![0]!.vpkgEnergyUj[1]!.toString() },
      dram: { energy_uj: out.domains![1]!.vpkgEnergyUj[1]!.toString() },
      psys: { energy_uj: out.domains![2]!.vpkgEnergyUj[1]!.toString() },
    });
    const table = formatTable(summary).split('\n');
    expect(table[1]).toMatch(/^VM\s+PID\s+STATE\s+VPKG\s+JOULES\s+AVG W\s+OVER S\s+CORE J\s+DRAM J\s+PSYS J$/);
    expect(table[2]).toMatch(new RegExp(`^a\\s+10\\s+running\\s+0\\s.*\\s${out.domains![0]!.vpkgEnergyJ[0]!.toFixed(3)}\\s+\\S+\\s+\\S+$`));
    expect(table.at(-2)).toBe("JOULES and AVG W are the package domain's; CORE J, DRAM J, PSYS J: the joules of that RAPL domain");
  });

  test('the same trace without its domains replays to the same package numbers, and its output has no domains key', async () => {
    const withDomains = await replayLines(traceText({ host: HOST }, SAMPLES));
    const plain = await replayLines(
      traceText(
        { host: host([1, 1]) },
        SAMPLES.map(({ domains: _, ...s }) => s),
      ),
    );
    const strip = (line: string): string => JSON.stringify(JSON.parse(line), (k, v: unknown) => (k === 'domains' ? undefined : v));
    expect(plain.lines.join('\n')).not.toContain('domains');
    expect(plain.lines.map(strip)).toEqual(withDomains.lines.map(strip));
    expect(formatTable(plain.summary)).not.toMatch(/CORE J|package domain/);
  });
});

describe('trace domains: hostile fields are refused with their line', () => {
  const cases: [string, string, RegExp][] = [
    ['host.domains not an array', headerJson({ domains: { dram: 1 } }), /^line 1: header: host\.domains must be an array/],
    ['an entry not an object', headerJson({ domains: [7] }), /^line 1: header: host\.domains\[0\] must be an object/],
    [
      'an unknown domain',
      headerJson({ domains: [{ ...DRAM0, domain: 'gpu' }] }),
      /^line 1: header: host\.domains\[0\]\.domain must be one of core, uncore, dram, psys, got "gpu"$/,
    ],
    ['the package as a domain', headerJson({ domains: [{ ...DRAM0, domain: 'package' }] }), /\.domain must be one of core/],
    [
      'a package the header lacks',
      headerJson({ domains: [{ ...DRAM0, package: 7 }] }),
      /^line 1: header: host\.domains\[0\]: the dram counter of package 7: package 7 is not among the host's packages$/,
    ],
    [
      'listed twice',
      headerJson({ domains: [DRAM0, DRAM0] }),
      /^line 1: header: host\.domains\[1\]: the dram counter of package 0 is listed twice$/,
    ],
    [
      'psys twice',
      headerJson({
        domains: [
          { ...DRAM0, domain: 'psys' },
          { ...DRAM0, domain: 'psys', package: 1 },
        ],
      }),
      /host\.domains\[1\]: the psys counter of package 1: psys counts the whole platform and is listed once$/,
    ],
    [
      'a range not hex',
      headerJson({ domains: [{ ...DRAM0, range: 4294967296 }] }),
      /^line 1: host\.domains\[0\]\.range: expected a hex string/,
    ],
    ['a range of 1', headerJson({ domains: [{ ...DRAM0, range: '0x1' }] }), /the dram counter of package 0: range 1 is out of 2\.\.2\^53$/],
    [
      'a range past 2^53',
      headerJson({ domains: [{ ...DRAM0, range: '0x20000000000001' }] }),
      /range 9007199254740993 is out of 2\.\.2\^53$/,
    ],
    ['a unit of 0', headerJson({ domains: [{ ...DRAM0, unit_j: 0 }] }), /unit 0 J is not a number of joules in \(0, 1\]$/],
    ['a unit past 1 J', headerJson({ domains: [{ ...DRAM0, unit_j: 1e300 }] }), /unit 1e\+300 J is not a number of joules in \(0, 1\]$/],
    [
      'a unit as text',
      headerJson({ domains: [{ ...DRAM0, unit_j: '1e-6' }] }),
      /^line 1: header: host\.domains\[0\]\.unit_j must be joules per count/,
    ],
    [
      'a package id not an integer',
      headerJson({ domains: [{ ...DRAM0, package: -1 }] }),
      /host\.domains\[0\]\.package must be a non-negative integer/,
    ],
    [
      'sample domains not an object',
      headerJson({ domains: [DRAM0] }) + sampleJson(['dram']),
      /^line 2: sample: domains must be an object \{domain: \{package id: "0x\.\.\."\}\}$/,
    ],
    [
      'an unknown domain in a sample',
      headerJson({ domains: [DRAM0] }) + sampleJson({ hbm: { '0': '0x1' } }),
      /^line 2: sample: domains: key "hbm" is not one of core, uncore, dram, psys$/,
    ],
    [
      'a package key not an id',
      headerJson({ domains: [DRAM0] }) + sampleJson({ dram: { pkg0: '0x1' } }),
      /^line 2: domains\["dram"\]: key "pkg0" is not a decimal id$/,
    ],
    [
      'a value not hex',
      headerJson({ domains: [DRAM0] }) + sampleJson({ dram: { '0': 12 } }),
      /^line 2: domains\["dram"\]\["0"\]: expected a hex string/,
    ],
    [
      'a value past 64 bits',
      headerJson({ domains: [DRAM0] }) + sampleJson({ dram: { '0': '0x10000000000000000' } }),
      /^line 2: domains\["dram"\]\["0"\]: /,
    ],
    [
      'a domain entry not an object',
      headerJson({ domains: [DRAM0] }) + sampleJson({ dram: '0x1' }),
      /^line 2: sample: domains\["dram"\] must be an object/,
    ],
  ];
  for (const [name, text, message] of cases) test(`${name}`, async () => expect(await refusal(text)).toMatch(message));

  test('a header given to replay without the reader (records made in code) is refused by the engine, naming its line', async () => {
    const bad: TraceRecord = { type: 'header', line: 1, header: { host: { ...host([1]), domains: [{ ...COUNTERS[0]!, pkg: 3 }] } } };
    await expect(replayRecords([bad])).rejects.toThrow(
      /^line 1: header: the core counter of package 3: package 3 is not among the host's packages$/,
    );
  });

  test('a sample reading of a domain or package the header does not describe is left out, counted as a problem naming its line', async () => {
    const text =
      headerJson({ domains: [DRAM0] }) +
      sampleJson({ dram: { '0': '0x10' }, core: { '0': '0x5' } }) +
      sampleJson({ dram: { '0': '0x20', '1': '0x5' } }).replace('"t_ns":5', '"t_ns":6');
    const { summary } = await replayLines(text);
    expect(summary.intervals).toBe(1);
    expect(summary.problems.first).toEqual([
      'line 2: core energy given for package 0, which the host does not read: ignored',
      'line 3: dram energy given for package 1, which the host does not read: ignored',
    ]);
  });
});
