/** Writes vmsr-trace v1 (docs/trace-format.md), gzip for a .gz name; a whole trace after every record (docs/recording.md "A full disk"). */
import fs from 'node:fs';
import os from 'node:os';
import zlib from 'node:zlib';
import { formatMsrHex } from '../ratio/counter.js';
import type { Sample, TraceHeader } from '../model/sample.js';
import type { VmSpec } from '../model/vm.js';
import { cannot } from '../common/errors.js';

export function headerRecord(h: TraceHeader): Record<string, unknown> {
  return {
    type: 'header',
    format: 'vmsr-trace',
    version: 1,
    clk_tck: h.host.clkTck,
    host: {
      vendor: h.host.vendor,
      cpus: h.host.cpus.map((c) => ({ cpu: c.cpu, package: c.pkg })),
      packages: h.host.packages.map((p) => {
        const o: Record<string, unknown> = { package: p.pkg, power_unit: formatMsrHex(p.powerUnit) };
        if (p.powerLimit !== undefined) o.power_limit = formatMsrHex(p.powerLimit);
        if (p.powerInfo !== undefined) o.power_info = formatMsrHex(p.powerInfo);
        // Only when the counter is not a RAPL MSR's: a trace of MSRs stays as it always was.
        if (p.counter !== undefined) o.counter = { range: formatMsrHex(p.counter.range), unit_j: p.counter.unitJ };
        return o;
      }),
      // Only when the source reads domains besides the package: a trace of the package alone stays as it was.
      domains:
        h.host.domains === undefined || h.host.domains.length === 0
          ? undefined
          : h.host.domains.map((d) => ({ package: d.pkg, domain: d.domain, range: formatMsrHex(d.range), unit_j: d.unitJ })),
    },
    note: h.note, // JSON.stringify leaves it out when undefined
    start_time: h.startTime,
    hostname: h.hostname,
  };
}

/** The header line; start_t_ns is written as an exact integer like every t_ns. */
export function headerLine(h: TraceHeader): string {
  const json = JSON.stringify(headerRecord(h));
  return h.startNs === undefined ? `${json}\n` : `${json.slice(0, -1)},"start_t_ns":${h.startNs.toString()}}\n`;
}

interface OpenOptions {
  /** Replace an existing file; without it, an existing file is an error (nothing is lost by accident). */
  overwrite?: boolean;
  /** The file, already opened for writing elsewhere (the daemon, as root before its privilege drop). */
  fd?: number;
  /** Told when a full disk pauses the recording and when it resumes (default: lines on stderr). */
  events?: TraceWriterEvents;
}

// t_ns is written as an exact decimal literal (a bigint can exceed 2^53 on hosts up for months).
function withTime(type: string, tNs: bigint, rest: string): string {
  return `{"type":"${type}","t_ns":${tNs.toString()}${rest}}\n`;
}

export function registerLine(tNs: bigint, vm: VmSpec): string {
  const v = { pid: vm.pid, starttime: vm.starttime, name: vm.name, vcpus: vm.vcpus.map((c) => ({ tid: c.tid, vpkg: c.vpkg })) };
  return withTime('register', tNs, `,"vm":${JSON.stringify(v)}`);
}

export function sampleLine(s: Sample): string {
  const energy = Object.fromEntries([...s.energy].map(([pkg, raw]) => [pkg, formatMsrHex(raw)]));
  const tasks = Object.fromEntries([...s.tasks].map(([pid, lines]) => [pid, Object.fromEntries(lines)]));
  // Other domains, raw counter hex by domain, then package id; none: no key, as before they came.
  const byDomain: Record<string, Record<string, string>> = {};
  for (const r of s.domains ?? []) (byDomain[r.domain] ??= {})[r.pkg] = formatMsrHex(r.raw);
  const domains = s.domains?.length ? `,"domains":${JSON.stringify(byDomain)}` : '';
  return withTime('sample', s.tNs, `,"energy":${JSON.stringify(energy)}${domains},"tasks":${JSON.stringify(tasks)}`);
}

/** Samples are missing from `tNs` (the first lost one) on: `lost` of them. */
export function gapLine(tNs: bigint, lost: number): string {
  return withTime('gap', tNs, `,"lost_samples":${lost}`);
}

/** Bytes of records held while the disk is full (past it the recording stops); samples, the bulk, are not held but lost. */
const MAX_PENDING_BYTES = 1 << 20;
/** Deflate's window: each record is compressed with this much of what precedes it as dictionary. */
const WINDOW = 32 * 1024;
const GZIP_HEADER = Buffer.from([0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3]);
/** Errors after which recording pauses and retries (the disk or the quota is full); any other stops it. */
const PAUSING_ERRORS = new Set(['ENOSPC', 'EDQUOT']);

/** What a writer tells its user about a full disk (default: a line on stderr). */
interface TraceWriterEvents {
  paused(why: string): void;
  resumed(lostSamples: number, pausedS: number): void;
}

const stderrEvents = (path: string): TraceWriterEvents => ({
  paused: (why) =>
    process.stderr.write(
      `trace ${path}: recording paused: disk full (${why}); the file ends on its last whole record, samples are dropped and each interval tries again\n`,
    ),
  resumed: (lost, s) =>
    process.stderr.write(`trace ${path}: recording resumed after ${s.toFixed(1)} s; ${lost} samples lost (a gap record marks them)\n`),
});

/** A pending record: a line, or the gap (rendered when written, with the count by then). */
type Pending = { line: string } | { gapT: bigint };

export class TraceWriter {
  private lastSampleT: bigint | null = null;
  private closed: Promise<void> | null = null;
  private error: Error | null = null;
  samples = 0;
  /** Samples dropped while the disk was full, over the whole recording. */
  lostSamples = 0;
  /** Where the next record goes: the end of the last whole record (before the gzip end). */
  private end = 0;
  private crc = 0;
  private size = 0;
  /** The last WINDOW bytes of text written (the next record's dictionary). */
  private tail = Buffer.alloc(0);
  /** Non-null while paused: records to write first, in order. */
  private pending: Pending[] | null = null;
  private pendingBytes = 0;
  private lostNow = 0;
  private pausedAt = 0;

  private constructor(
    readonly path: string,
    private readonly fd: number,
    private readonly gzip: boolean,
    private readonly events: TraceWriterEvents,
  ) {}

  /** Creates the file (an existing one only with `overwrite`) and writes the header; a disk already full leaves it empty, paused. */
  static open(path: string, header: TraceHeader, o: OpenOptions = {}): TraceWriter {
    // Opening synchronously surfaces ENOENT/EACCES/EEXIST here, with the path, not later from a stream.
    let fd: number;
    try {
      fd = o.fd ?? fs.openSync(path, o.overwrite ? 'w' : 'wx', 0o644);
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      if (err.code === 'EEXIST')
        throw new Error(cannot(`write trace ${path}`, `the file exists`, `give --force to overwrite it, or another file name`));
      throw new Error(cannot(`write trace ${path}`, err.message));
    }
    const w = new TraceWriter(path, fd, path.endsWith('.gz'), o.events ?? stderrEvents(path));
    // Where and when the recording starts; startNs is CLOCK_MONOTONIC, the sampler's clock.
    const start = { startNs: process.hrtime.bigint(), startTime: new Date().toISOString(), hostname: os.hostname() };
    w.write(headerLine({ ...start, ...header }));
    return w;
  }

  /** Goes on with the previous process's trace through its `fd` (docs/daemon.md "Restarts"), a .gz in the same gzip stream. */
  static resume(path: string, fd: number, o: Pick<OpenOptions, 'events'> = {}): TraceWriter {
    const gzip = path.endsWith('.gz');
    const w = new TraceWriter(path, fd, gzip, o.events ?? stderrEvents(path));
    const size = fs.fstatSync(fd).size;
    if (!gzip) {
      if (size > 0) {
        const last = Buffer.alloc(1);
        const rd = fs.openSync(path, 'r');
        try {
          fs.readSync(rd, last, 0, 1, size - 1);
        } finally {
          fs.closeSync(rd);
        }
        if (last[0] !== 0x0a)
          throw new Error(cannot(`go on with trace ${path}`, 'it does not end on a whole record', 'start a new recording'));
      }
      w.end = size;
      return w;
    }
    if (size === 0) return w;
    let text: Buffer;
    try {
      text = zlib.gunzipSync(fs.readFileSync(path));
    } catch (e) {
      throw new Error(cannot(`go on with trace ${path}`, (e as Error).message, 'start a new recording'));
    }
    w.crc = zlib.crc32(text);
    w.size = text.length >>> 0;
    w.tail = Buffer.from(text.subarray(Math.max(0, text.length - WINDOW)));
    w.end = size - 10;
    return w;
  }

  /** Bytes on disk so far (compressed size for .gz). */
  get bytesWritten(): number {
    return this.end === 0 ? 0 : this.end + (this.gzip ? 10 : 0);
  }

  register(tNs: bigint, vm: VmSpec): void {
    this.write(registerLine(tNs, vm));
  }

  sample(s: Sample): void {
    if (this.lastSampleT !== null && s.tNs <= this.lastSampleT) {
      throw new Error(`trace ${this.path}: sample times must increase (${s.tNs} after ${this.lastSampleT})`);
    }
    this.lastSampleT = s.tNs;
    this.samples++;
    this.write(sampleLine(s), s.tNs);
  }

  unregister(tNs: bigint, pid: number): void {
    this.write(withTime('unregister', tNs, `,"pid":${pid}`));
  }

  /** Writes what is held back if it can and closes; rejects with what stopped the recording or what a full disk lost. Idempotent. */
  close(): Promise<void> {
    this.closed ??= (async () => {
      if (this.pending !== null && this.error === null) this.flushPending([]);
      fs.closeSync(this.fd);
      if (this.error) throw this.error;
      if (this.pending !== null) {
        throw new Error(
          cannot(
            `write the end of trace ${this.path}`,
            `the disk is still full`,
            `the file ends on its last whole record; ${this.lostNow} samples after it were lost`,
          ),
        );
      }
    })();
    return this.closed;
  }

  private write(line: string, sampleT?: bigint): void {
    if (this.closed) throw new Error(`trace ${this.path} is closed`);
    if (this.error) throw this.error;
    // Paused: a record is held, a sample tries again (once an interval) with everything held back before it.
    if (this.pending === null) {
      const failed = this.append([line]);
      if (failed === null) return;
      this.pending = [];
      this.pausedAt = Date.now();
      this.events.paused(failed);
    } else if (sampleT !== undefined && this.flushPending([line])) return;
    if (sampleT === undefined) this.hold({ line });
    else this.lose(sampleT);
  }

  /** Writes the held-back records and `then`; on success the writer runs again. */
  private flushPending(then: string[]): boolean {
    const lines = this.pending!.map((p) => ('line' in p ? p.line : gapLine(p.gapT, this.lostNow)));
    const failed = this.append([...lines, ...then]);
    if (failed !== null) return false;
    this.events.resumed(this.lostNow, (Date.now() - this.pausedAt) / 1000);
    this.pending = null;
    this.pendingBytes = 0;
    this.lostNow = 0;
    return true;
  }

  private lose(tNs: bigint): void {
    if (this.lostNow === 0) this.pending!.push({ gapT: tNs });
    this.lostNow++;
    this.lostSamples++;
    this.samples--;
  }

  private hold(p: { line: string }): void {
    this.pendingBytes += p.line.length;
    this.pending!.push(p);
    if (this.pendingBytes > MAX_PENDING_BYTES) {
      this.error = new Error(
        cannot(
          `go on recording trace ${this.path}`,
          `the disk has been full too long: more than ${MAX_PENDING_BYTES} bytes of registrations held back`,
          `free space and restart the recording; the file ends on its last whole record`,
        ),
      );
      throw this.error;
    }
  }

  /** Writes `lines` as whole records at the end of the file, or nothing: null, or the code of a PAUSING_ERRORS write undone. */
  private append(lines: string[]): string | null {
    const text = Buffer.from(lines.join(''));
    let data: Buffer;
    let crc = this.crc;
    let size = this.size;
    const start = this.end;
    if (this.gzip) {
      const seg = zlib.deflateRawSync(text, {
        finishFlush: zlib.constants.Z_SYNC_FLUSH,
        ...(this.tail.length ? { dictionary: this.tail } : {}),
      });
      crc = zlib.crc32(text, crc);
      size = (size + text.length) >>> 0;
      const trailer = gzipEnd(crc, size);
      data = Buffer.concat(start === 0 ? [GZIP_HEADER, seg, trailer] : [seg, trailer]);
    } else data = text;
    try {
      writeAllAt(this.fd, data, start);
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      this.undo();
      if (err.code !== undefined && PAUSING_ERRORS.has(err.code)) return err.code;
      this.error = new Error(`trace ${this.path}: ${err.message}`);
      throw this.error;
    }
    if (this.gzip) {
      this.end = start + data.length - 10;
      this.crc = crc;
      this.size = size;
      this.tail = Buffer.concat([this.tail, text]);
      if (this.tail.length > WINDOW) this.tail = Buffer.from(this.tail.subarray(this.tail.length - WINDOW));
    } else this.end = start + data.length;
    return null;
  }

  /** Cuts the file back to its last whole record and, for .gz, writes its gzip end again (not a device or pipe: nothing to cut). */
  private undo(): void {
    try {
      if (!fs.fstatSync(this.fd).isFile()) return;
      if (!this.gzip || this.end === 0) return void fs.ftruncateSync(this.fd, this.end);
      fs.ftruncateSync(this.fd, this.end + 10);
      // Bytes inside the file's size: their blocks are still allocated, this needs no space.
      writeAllAt(this.fd, gzipEnd(this.crc, this.size), this.end);
    } catch (e) {
      this.error = new Error(cannot(`cut trace ${this.path} back to its last whole record`, (e as Error).message));
      throw this.error;
    }
  }
}

/** The gzip end after a record: an empty final block (fixed Huffman: BFINAL, BTYPE 01, end-of-block), CRC-32 and length. */
function gzipEnd(crc: number, size: number): Buffer {
  const b = Buffer.alloc(10);
  b[0] = 0x03;
  b.writeUInt32LE(crc >>> 0, 2);
  b.writeUInt32LE(size, 6);
  return b;
}

function writeAllAt(fd: number, data: Buffer, position: number): void {
  let off = 0;
  while (off < data.length) off += fs.writeSync(fd, data, off, data.length - off, position + off);
}
