/**
 * Reads vmsr-trace v1 (docs/trace-format.md), plain or gzip, line by line. Untrusted:
 * each problem is a TraceError naming the line; lines are capped so a hostile file cannot make it allocate without bound.
 */
import fs from 'node:fs';
import type { Readable } from 'node:stream';
import zlib from 'node:zlib';
import { parseMsrHex } from '../ratio/counter.js';
import { TraceError, type TraceRecord } from '../ratio/trace-records.js';
import { replayRecords, type ReplaySummary } from '../ratio/trace-replay.js';
import type { IntervalResult } from '../ratio/outputs.js';
import { checkVcpus, MAX_TID, type VcpuSpec } from '../model/vcpus.js';
import { domainCounterProblem } from '../ratio/domain-counters.js';
import { isOtherDomain, OTHER_DOMAINS } from '../model/domains.js';
import type { CounterSpec, DomainCounter, HostCpu, HostPackage, Vendor } from '../model/host.js';
import type { DomainReading, Sample, TraceHeader } from '../model/sample.js';
import type { VmSpec } from '../model/vm.js';
import { cannot } from '../common/errors.js';

/** 32 MiB: a sample line holds every stat line of every VM (~350 bytes a thread); far above any real host. */
const DEFAULT_MAX_LINE_BYTES = 32 * 1024 * 1024;

/** A DNS name is at most 253 characters; Linux's host name at most 64. */
const MAX_HOSTNAME = 253;

/** Records nest a few levels (sample -> tasks -> pid -> tid); deeper is not a trace. */
const MAX_JSON_DEPTH = 32;

/** Blank lines are skipped, but this many in a row is not a trace (a recorder never writes one). */
const MAX_BLANK_RUN = 1_000_000;

/** Whether `text` nests deeper than `max`: checked before JSON.parse, whose result a hostile line would make overflow the stack. */
function nestsDeeperThan(text: string, max: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c)
        i++; // backslash: skip the escaped character
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return false;
}

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function describe(v: unknown): string {
  const text = JSON.stringify(v) ?? String(v);
  return text.length > 60 ? `${text.slice(0, 57)}...` : text;
}

/** Validates records line by line and their order (one header first, t_ns non-decreasing, samples increasing). Pure. */
export class TraceParser {
  private headerSeen = false;
  private lastT: bigint | undefined;
  private lastSampleT: bigint | undefined;
  private lineNo = 0;
  /** The text of the line being parsed (exact digits of integers past 2^53). */
  private rawLine = '';

  /** Parses one line (without its newline). Blank lines are skipped (null). */
  line(text: string, lineNo: number): TraceRecord | null {
    this.lineNo = lineNo;
    this.rawLine = text;
    if (text.trim() === '') return null;
    if (nestsDeeperThan(text, MAX_JSON_DEPTH))
      throw new TraceError(`JSON nested more than ${MAX_JSON_DEPTH} levels deep: not a trace record`, lineNo);
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (e) {
      throw new TraceError(`not valid JSON (${(e as Error).message})`, lineNo);
    }
    if (!isObject(value)) throw new TraceError(`a record must be a JSON object, got ${describe(value)}`, lineNo);
    const type = value.type;
    if (!this.headerSeen) {
      if (type !== 'header') throw new TraceError(`the first record must be the header, got type ${describe(type)}`, lineNo);
      this.headerSeen = true;
      return { type: 'header', line: lineNo, header: this.header(value) };
    }
    switch (type) {
      case 'header':
        throw new TraceError('a second header (a trace has exactly one, on its first line)', lineNo);
      case 'register':
        return { type: 'register', line: lineNo, tNs: this.time(value, text, false), vm: this.vm(value.vm) };
      case 'sample': {
        const tNs = this.time(value, text, true);
        const sample: Sample = { tNs, energy: this.energy(value.energy), tasks: this.tasks(value.tasks) };
        // Added later: absent in older traces and where only the package is read.
        if (value.domains !== undefined) sample.domains = this.domainReadings(value.domains);
        return { type: 'sample', line: lineNo, sample };
      }
      case 'unregister':
        return { type: 'unregister', line: lineNo, tNs: this.time(value, text, false), pid: this.id(value.pid, 'pid') };
      case 'gap':
        return {
          type: 'gap',
          line: lineNo,
          tNs: this.time(value, text, false),
          lostSamples: this.uint(value.lost_samples, 'lost_samples'),
        };
      default:
        throw new TraceError(`unknown record type ${describe(type)}`, lineNo);
    }
  }

  /** Call at end of input; throws when the trace had no header at all. */
  end(): void {
    if (!this.headerSeen) throw new TraceError('no header: the trace is empty');
  }

  private fail(message: string): never {
    throw new TraceError(message, this.lineNo);
  }

  /** A package counter's description: {"range": hex, at least 2, "unit_j": joules per count, positive}. */
  private counterSpec(c: unknown, what: string): CounterSpec {
    if (!isObject(c)) this.fail(`header: ${what} must be an object like {"range":"0x3d08ffffff","unit_j":0.000001}`);
    const range = this.hex(c.range, `${what}.range`);
    if (range < 2n) this.fail(`header: ${what}.range must be at least 2, got ${describe(c.range)}`);
    const unitJ = c.unit_j;
    if (typeof unitJ !== 'number' || !Number.isFinite(unitJ) || unitJ <= 0 || unitJ > 1)
      this.fail(`header: ${what}.unit_j must be joules per count in (0, 1], got ${describe(unitJ)}`);
    return { range, unitJ };
  }

  /** host.domains, each checked by the engine's own rule (ratio/domain-counters.ts). */
  private domainCounters(list: unknown, pkgIds: ReadonlySet<number>): DomainCounter[] {
    if (!Array.isArray(list))
      this.fail('header: host.domains must be an array like [{"package":0,"domain":"dram","range":"0x100000000","unit_j":0.0000153}]');
    const out: DomainCounter[] = [];
    list.forEach((d: unknown, i: number) => {
      const what = `host.domains[${i}]`;
      if (!isObject(d)) this.fail(`header: ${what} must be an object {"package","domain","range","unit_j"}`);
      const pkg = this.uint(d.package, `${what}.package`);
      if (!isOtherDomain(d.domain))
        this.fail(`header: ${what}.domain must be one of ${OTHER_DOMAINS.join(', ')}, got ${describe(d.domain)}`);
      const range = this.hex(d.range, `${what}.range`);
      const unitJ = d.unit_j;
      if (typeof unitJ !== 'number') this.fail(`header: ${what}.unit_j must be joules per count (a number), got ${describe(unitJ)}`);
      const counter: DomainCounter = { pkg, domain: d.domain, range, unitJ };
      const problem = domainCounterProblem(counter, pkgIds, out);
      if (problem !== undefined) this.fail(`header: ${what}: ${problem}`);
      out.push(counter);
    });
    return out;
  }

  private header(v: Json): TraceHeader {
    if (v.format !== 'vmsr-trace') this.fail(`header: format must be "vmsr-trace", got ${describe(v.format)}`);
    if (v.version !== 1) this.fail(`header: unsupported version ${describe(v.version)} (this reader knows version 1)`);
    const clkTck = v.clk_tck;
    if (typeof clkTck !== 'number' || !Number.isInteger(clkTck) || clkTck < 1 || clkTck > 1_000_000)
      this.fail(`header: clk_tck must be a positive integer, got ${describe(clkTck)}`);
    const host = v.host;
    if (!isObject(host)) this.fail('header: host must be an object');
    if (host.vendor !== 'intel' && host.vendor !== 'amd')
      this.fail(`header: host.vendor must be "intel" or "amd", got ${describe(host.vendor)}`);
    const vendor: Vendor = host.vendor;
    if (!Array.isArray(host.packages) || host.packages.length === 0) this.fail('header: host.packages must be a non-empty array');
    const packages: HostPackage[] = [];
    const pkgIds = new Set<number>();
    host.packages.forEach((p: unknown, i: number) => {
      if (!isObject(p)) this.fail(`header: host.packages[${i}] must be an object`);
      const id = this.uint(p.package, `host.packages[${i}].package`);
      if (pkgIds.has(id)) this.fail(`header: package ${id} is listed twice`);
      pkgIds.add(id);
      const pkg: HostPackage = { pkg: id, powerUnit: this.hex(p.power_unit, `host.packages[${i}].power_unit`) };
      if (p.power_limit !== undefined) pkg.powerLimit = this.hex(p.power_limit, `host.packages[${i}].power_limit`);
      if (p.power_info !== undefined) pkg.powerInfo = this.hex(p.power_info, `host.packages[${i}].power_info`);
      // Added later (powercap): absent, the counter is a RAPL MSR's.
      if (p.counter !== undefined) pkg.counter = this.counterSpec(p.counter, `host.packages[${i}].counter`);
      packages.push(pkg);
    });
    if (!Array.isArray(host.cpus)) this.fail('header: host.cpus must be an array');
    const cpus: HostCpu[] = [];
    const cpuIds = new Set<number>();
    host.cpus.forEach((c: unknown, i: number) => {
      if (!isObject(c)) this.fail(`header: host.cpus[${i}] must be an object`);
      const cpu = this.uint(c.cpu, `host.cpus[${i}].cpu`);
      const pkg = this.uint(c.package, `host.cpus[${i}].package`);
      if (cpuIds.has(cpu)) this.fail(`header: cpu ${cpu} is listed twice`);
      if (!pkgIds.has(pkg)) this.fail(`header: cpu ${cpu} is in package ${pkg}, which host.packages does not list`);
      cpuIds.add(cpu);
      cpus.push({ cpu, pkg });
    });
    const header: TraceHeader = { host: { vendor, clkTck, cpus, packages } };
    // Added later (other RAPL domains): absent, only the package is read, as in every older trace.
    if (host.domains !== undefined) {
      const domains = this.domainCounters(host.domains, pkgIds);
      if (domains.length > 0) header.host.domains = domains;
    }
    if (typeof v.note === 'string') header.note = v.note;
    // Added later to the format: traces without them (older recorders) stay valid.
    const t = v.start_time;
    if (t !== undefined) {
      if (typeof t !== 'string' || t.length > 64 || !/^\d{4}-\d\d-\d\dT/.test(t) || Number.isNaN(Date.parse(t)))
        this.fail(`header: start_time must be an ISO 8601 time like "2026-01-31T12:00:00.000Z", got ${describe(t)}`);
      header.startTime = t;
    }
    if (v.start_t_ns !== undefined) header.startNs = this.nanoseconds(v.start_t_ns, this.rawLine, 'start_t_ns');
    const h = v.hostname;
    if (h !== undefined) {
      if (typeof h !== 'string' || h.length === 0 || h.length > MAX_HOSTNAME || /[\u0000-\u001f\u007f-\u009f]/.test(h))
        this.fail(`header: hostname must be a host name of 1..${MAX_HOSTNAME} printable characters, got ${describe(h)}`);
      header.hostname = h;
    }
    return header;
  }

  /** t_ns: a JSON integer (or decimal string); checks the time order of the trace. */
  private time(v: Json, raw: string, isSample: boolean): bigint {
    const t = this.nanoseconds(v.t_ns, raw);
    if (this.lastT !== undefined && t < this.lastT) this.fail(`t_ns ${t} goes back in time (the previous record has ${this.lastT})`);
    if (isSample && this.lastSampleT !== undefined && t <= this.lastSampleT) {
      this.fail(`sample t_ns ${t} is not after the previous sample's (${this.lastSampleT}); samples must be strictly increasing`);
    }
    this.lastT = t;
    if (isSample) this.lastSampleT = t;
    return t;
  }

  private nanoseconds(t: unknown, raw: string, key = 't_ns'): bigint {
    if (typeof t === 'string' && /^\d{1,20}$/.test(t)) return BigInt(t);
    if (typeof t === 'number' && Number.isInteger(t) && t >= 0) {
      if (Number.isSafeInteger(t)) return BigInt(t);
      // Past 2^53 ns (104 days of uptime) JSON.parse rounds; take the digits from the text itself.
      const all = [...raw.matchAll(new RegExp(`"${key}"\\s*:\\s*(\\d{1,20})\\s*[,}]`, 'g'))];
      if (all.length === 1) return BigInt(all[0]![1]!);
    }
    return this.fail(`${key} must be a non-negative integer (nanoseconds), got ${describe(t)}`);
  }

  private vm(v: unknown): VmSpec {
    if (!isObject(v)) this.fail('register: vm must be an object');
    const pid = this.id(v.pid, 'vm.pid');
    const starttime = this.uint(v.starttime, 'vm.starttime');
    if (v.name !== undefined && typeof v.name !== 'string') this.fail(`register: vm.name must be a string, got ${describe(v.name)}`);
    if (!Array.isArray(v.vcpus)) this.fail('register: vm.vcpus must be an array');
    const list: VcpuSpec[] = v.vcpus.map((c: unknown, i: number) => {
      if (!isObject(c)) this.fail(`register: vm.vcpus[${i}] must be an object`);
      return { tid: this.id(c.tid, `vm.vcpus[${i}].tid`), vpkg: this.uint(c.vpkg, `vm.vcpus[${i}].vpkg`) };
    });
    const vcpus = checkVcpus(list);
    if (!vcpus.ok) this.fail(`register: ${vcpus.error}`);
    const spec: VmSpec = { pid, starttime, vcpus: vcpus.value };
    if (typeof v.name === 'string') spec.name = v.name;
    return spec;
  }

  private energy(v: unknown): Map<number, bigint> {
    if (!isObject(v)) this.fail('sample: energy must be an object {package id: "0x..."}');
    return new Map(Object.entries(v).map(([k, raw]) => [this.key(k, 'energy'), this.hex(raw, `energy["${k}"]`)]));
  }

  /** A sample's other domains, {"dram":{"0":"0x1234"}}; one the header does not describe is kept (the engine says so, not fatal). */
  private domainReadings(v: unknown): DomainReading[] {
    if (!isObject(v)) this.fail('sample: domains must be an object {domain: {package id: "0x..."}}');
    const out: DomainReading[] = [];
    for (const [domain, byPkg] of Object.entries(v)) {
      if (!isOtherDomain(domain)) this.fail(`sample: domains: key ${describe(domain)} is not one of ${OTHER_DOMAINS.join(', ')}`);
      if (!isObject(byPkg)) this.fail(`sample: domains["${domain}"] must be an object {package id: "0x..."}`);
      for (const [k, raw] of Object.entries(byPkg))
        out.push({ domain, pkg: this.key(k, `domains["${domain}"]`), raw: this.hex(raw, `domains["${domain}"]["${k}"]`) });
    }
    return out;
  }

  private tasks(v: unknown): Map<number, Map<number, string>> {
    if (!isObject(v)) this.fail('sample: tasks must be an object {pid: {tid: stat line}}');
    const out = new Map<number, Map<number, string>>();
    for (const [pidKey, threads] of Object.entries(v)) {
      const pid = this.key(pidKey, 'tasks');
      if (!isObject(threads)) this.fail(`sample: tasks["${pidKey}"] must be an object {tid: stat line}`);
      const m = new Map<number, string>();
      for (const [tidKey, line] of Object.entries(threads)) {
        const tid = this.key(tidKey, `tasks["${pidKey}"]`);
        if (typeof line !== 'string')
          this.fail(`sample: tasks["${pidKey}"]["${tidKey}"] must be a stat line string, got ${describe(line)}`);
        m.set(tid, line);
      }
      out.set(pid, m);
    }
    return out;
  }

  private key(k: string, where: string): number {
    if (!/^\d{1,10}$/.test(k) || Number(k) > MAX_TID) this.fail(`${where}: key ${describe(k)} is not a decimal id`);
    return Number(k);
  }

  private uint(v: unknown, what: string): number {
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) this.fail(`${what} must be a non-negative integer, got ${describe(v)}`);
    return v;
  }

  private id(v: unknown, what: string): number {
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > MAX_TID)
      this.fail(`${what} must be a positive integer id, got ${describe(v)}`);
    return v;
  }

  private hex(v: unknown, what: string): bigint {
    try {
      return parseMsrHex(v, what);
    } catch (e) {
      return this.fail((e as Error).message);
    }
  }
}

interface ReadOptions {
  maxLineBytes?: number;
  /** Called about every 64 KiB read, for progress on long scans. */
  onProgress?: (p: ScanProgress) => void;
}

export interface ScanProgress {
  /** Lines scanned so far, blank ones included. */
  lines: number;
  /** File bytes read so far (compressed, for gzip); undefined for a plain stream. */
  fileBytes?: number;
}

/** Splits a byte stream into UTF-8-checked lines numbered from 1; an over-long line or broken gzip is a TraceError. */
async function* splitLines(
  stream: AsyncIterable<Buffer | string>,
  opts: ReadOptions = {},
  fileBytes?: () => number,
): AsyncGenerator<{ lineNo: number; text: string; lastUnterminated: boolean }> {
  const max = opts.maxLineBytes ?? DEFAULT_MAX_LINE_BYTES;
  const decoder = new TextDecoder('utf-8', { fatal: true });
  const decode = (buf: Buffer, lineNo: number): string => {
    try {
      return decoder.decode(buf);
    } catch {
      throw new TraceError('not valid UTF-8', lineNo);
    }
  };
  let parts: Buffer[] = [];
  let pending = 0;
  let lineNo = 1;
  let blankRun = 0;
  /** n blank lines starting at line `first`; the one past MAX_BLANK_RUN in a row is refused. */
  const blank = (n: number, first: number) => {
    if (blankRun + n > MAX_BLANK_RUN) {
      throw new TraceError(
        `more than ${MAX_BLANK_RUN} blank lines in a row: not a trace (a recorder never writes blank lines)`,
        first + MAX_BLANK_RUN - blankRun,
      );
    }
    blankRun += n;
  };
  try {
    for await (const chunk of stream) {
      const buf = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
      opts.onProgress?.({ lines: lineNo - 1, ...(fileBytes ? { fileBytes: fileBytes() } : {}) });
      let start = 0;
      for (;;) {
        // Blank lines cost a byte each: skipped here, never decoded or yielded.
        if (pending === 0) {
          let i = start;
          while (i < buf.length && buf[i] === 10) i++;
          if (i > start) {
            const n = i - start;
            blank(n, lineNo);
            lineNo += n;
            start = i;
          }
          let j = start;
          while (j < buf.length && (buf[j] === 0x20 || buf[j] === 0x09 || buf[j] === 0x0d)) j++;
          if (j < buf.length && buf[j] === 10) {
            blank(1, lineNo);
            lineNo++;
            start = j + 1;
            continue;
          }
        }
        const nl = buf.indexOf(10, start);
        if (nl === -1) break;
        blankRun = 0;
        if (pending + (nl - start) > max) throw new TraceError(`line longer than ${max} bytes (the reader's cap)`, lineNo);
        parts.push(buf.subarray(start, nl));
        const line = parts.length === 1 ? parts[0]! : Buffer.concat(parts);
        yield { lineNo, text: decode(line, lineNo), lastUnterminated: false };
        parts = [];
        pending = 0;
        lineNo++;
        start = nl + 1;
      }
      if (start < buf.length) {
        pending += buf.length - start;
        if (pending > max) throw new TraceError(`line longer than ${max} bytes (the reader's cap)`, lineNo);
        parts.push(buf.subarray(start));
      }
    }
  } catch (e) {
    if (e instanceof TraceError) throw e;
    const err = e as NodeJS.ErrnoException;
    if (err.code?.startsWith('Z_') || /unexpected end of file|incorrect header check|invalid/i.test(err.message)) {
      throw new TraceError(`gzip data is truncated or corrupt (${err.message})`, lineNo);
    }
    throw new TraceError(`read failed: ${err.message}`, lineNo);
  }
  if (pending > 0) yield { lineNo, text: decode(Buffer.concat(parts), lineNo), lastUnterminated: true };
}

/** Parses a whole byte stream (already decompressed) into records. */
export async function* readTraceStream(
  stream: AsyncIterable<Buffer | string>,
  opts: ReadOptions = {},
  fileBytes?: () => number,
): AsyncGenerator<TraceRecord> {
  const parser = new TraceParser();
  for await (const { lineNo, text, lastUnterminated } of splitLines(stream, opts, fileBytes)) {
    let rec: TraceRecord | null;
    try {
      rec = parser.line(text, lineNo);
    } catch (e) {
      if (lastUnterminated && e instanceof TraceError && /not valid JSON/.test(e.message)) {
        throw new TraceError('truncated: the last line ends without a newline in the middle of a record', lineNo);
      }
      throw e;
    }
    if (rec) yield rec;
  }
  parser.end();
}

const GZIP_MAGIC = [0x1f, 0x8b];

/** Opens a trace file (gzip detected by its magic bytes, not its name) and yields its records. */
export async function* readTrace(path: string, opts: ReadOptions = {}): AsyncGenerator<TraceRecord> {
  let fh: fs.promises.FileHandle | undefined;
  const head = Buffer.alloc(2);
  let headBytes: number;
  try {
    fh = await fs.promises.open(path, 'r');
    if ((await fh.stat()).isDirectory()) throw new TraceError(cannot(`read trace ${path}`, `it is a directory`));
    ({ bytesRead: headBytes } = await fh.read(head, 0, 2, 0));
  } catch (e) {
    await fh?.close();
    if (e instanceof TraceError) throw e;
    throw new TraceError(cannot(`read trace ${path}`, (e as Error).message));
  }
  // The same open file is streamed from the start: what was sniffed is what is read.
  const file = fh.createReadStream({ start: 0, highWaterMark: 1 << 16 });
  const gz = headBytes === 2 && head[0] === GZIP_MAGIC[0] && head[1] === GZIP_MAGIC[1];
  if (!gz && /\.gz$/i.test(path)) {
    file.destroy();
    const magic = [...head.subarray(0, headBytes)].map((x) => x.toString(16).padStart(2, '0')).join(' ') || 'nothing';
    throw new TraceError(
      `not gzip: the name ends in .gz but the file starts with ${magic}, not the gzip magic 1f 8b; is it truncated or mis-named?`,
      undefined,
      path,
    );
  }
  let source: Readable = file;
  if (gz) {
    const gunzip = zlib.createGunzip();
    file.on('error', (err) => gunzip.destroy(err));
    source = file.pipe(gunzip);
  }
  try {
    yield* readTraceStream(source, opts, () => file.bytesRead);
  } catch (e) {
    throw e instanceof TraceError ? e.inFile(path) : e;
  } finally {
    source.destroy();
    file.destroy();
  }
}

/** Replays a trace file through the replay engine. Every TraceError, the engine's included, names the file: "FILE: line N: why". */
export async function replayFile(path: string, onInterval?: (r: IntervalResult) => void, opts?: ReadOptions): Promise<ReplaySummary> {
  try {
    return await replayRecords(readTrace(path, opts), onInterval);
  } catch (e) {
    throw e instanceof TraceError ? e.inFile(path) : e;
  }
}
