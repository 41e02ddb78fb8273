/**
 * Writes a `vmsr-trace` v1 file (docs/trace-format.md): JSON Lines, gzip when the name ends in .gz.
 * Every record is flushed through gzip as it is written, so a recorder killed hard still leaves a
 * readable prefix; close() finishes the stream and resolves once every byte is on disk.
 */
import fs from 'node:fs';
import os from 'node:os';
import zlib from 'node:zlib';
import { formatMsrHex } from '../ratio/counter.js';
import type { Sample, TraceHeader, VmSpec } from '../ratio/types.js';
import { cannot } from '../common/errors.js';

export function headerRecord(h: TraceHeader): Record<string, unknown> {
  return {
    type: 'header',
    format: 'vmsr-trace',
    version: 1,
    clk_tck: h.host.clkTck,
    host: {
      vendor: h.host.vendor,
      cpus: h.host.cpus.map((c) => ({ cpu: c.cpu, package: c.package })),
      packages: h.host.packages.map((p) => {
        const o: Record<string, unknown> = { package: p.package, power_unit: formatMsrHex(p.powerUnit) };
        if (p.powerLimit !== undefined) o.power_limit = formatMsrHex(p.powerLimit);
        if (p.powerInfo !== undefined) o.power_info = formatMsrHex(p.powerInfo);
        return o;
      }),
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

/**
 * Where and when a recording starts: wall clock, CLOCK_MONOTONIC at that moment (process.hrtime, the
 * sampler's clock), host name.
 */
export function recordingStart(clockNs: () => bigint = () => process.hrtime.bigint()): Required<Pick<TraceHeader, 'startTime' | 'startNs' | 'hostname'>> {
  return { startNs: clockNs(), startTime: new Date().toISOString(), hostname: os.hostname() };
}

export interface OpenOptions {
  /** Replace an existing file; without it, an existing file is an error (nothing is lost by accident). */
  overwrite?: boolean;
  /** The file, already opened for writing elsewhere (the daemon, as root before its privilege drop). */
  fd?: number;
}

// t_ns is written as an exact decimal literal (a bigint can exceed 2^53 on hosts up for months).
function withTime(type: string, tNs: bigint, rest: string): string {
  return `{"type":"${type}","t_ns":${tNs.toString()}${rest}}\n`;
}

export function registerLine(tNs: bigint, vm: VmSpec): string {
  const v: Record<string, unknown> = { pid: vm.pid, starttime: vm.starttime };
  if (vm.name !== undefined) v.name = vm.name;
  v.vcpus = vm.vcpus.map((c) => ({ tid: c.tid, vpkg: c.vpkg }));
  return withTime('register', tNs, `,"vm":${JSON.stringify(v)}`);
}

export function sampleLine(s: Sample): string {
  const energy: Record<string, string> = {};
  for (const [pkg, raw] of s.energy) energy[String(pkg)] = formatMsrHex(raw);
  const tasks: Record<string, Record<string, string>> = {};
  for (const [pid, lines] of s.tasks) {
    const t: Record<string, string> = {};
    for (const [tid, line] of lines) t[String(tid)] = line;
    tasks[String(pid)] = t;
  }
  return withTime('sample', s.tNs, `,"energy":${JSON.stringify(energy)},"tasks":${JSON.stringify(tasks)}`);
}

export function unregisterLine(tNs: bigint, pid: number): string {
  return withTime('unregister', tNs, `,"pid":${pid}`);
}

export class TraceWriter {
  private lastSampleT: bigint | null = null;
  private closed: Promise<void> | null = null;
  private error: Error | null = null;
  /** Records written so far (header included). */
  records = 0;
  samples = 0;

  private constructor(
    readonly path: string,
    private readonly file: fs.WriteStream,
    private readonly gzip: zlib.Gzip | null,
  ) {
    const onError = (e: Error) => {
      this.error ??= new Error(`trace ${path}: ${e.message}`);
    };
    file.on('error', onError);
    gzip?.on('error', onError);
  }

  /**
   * Creates the file and writes the header (with the start time and host name added when the caller
   * did not give them). Throws at once if the file cannot be created, or exists and `overwrite` is
   * not set. `o.fd`: the file already opened for writing (by the daemon as root, before its
   * privilege drop): used as is.
   */
  static open(path: string, header: TraceHeader, o: OpenOptions = {}): TraceWriter {
    // Opening synchronously surfaces ENOENT/EACCES/EEXIST here, with the path, not later from a stream.
    let fd: number;
    try {
      fd = o.fd ?? fs.openSync(path, o.overwrite ? 'w' : 'wx', 0o644);
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      if (err.code === 'EEXIST') throw new Error(cannot(`write trace ${path}`, `the file exists`, `give --force to overwrite it, or another file name`));
      throw new Error(cannot(`write trace ${path}`, err.message));
    }
    const file = fs.createWriteStream(path, { fd });
    const gzip = path.endsWith('.gz') ? zlib.createGzip() : null;
    if (gzip) gzip.pipe(file);
    const w = new TraceWriter(path, file, gzip);
    w.write(headerLine({ ...recordingStart(), ...header }));
    return w;
  }

  /** Bytes on disk so far (compressed size for .gz). */
  get bytesWritten(): number {
    return this.file.bytesWritten;
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
    this.write(sampleLine(s));
  }

  unregister(tNs: bigint, pid: number): void {
    this.write(unregisterLine(tNs, pid));
  }

  /**
   * Ends the stream; resolves when everything is flushed and the file closed, rejects with the first
   * write error (also one from before the call). Idempotent.
   */
  close(): Promise<void> {
    this.closed ??= new Promise<void>((resolve, reject) => {
      const settle = () => (this.error ? reject(this.error) : resolve());
      // A write error destroys the file stream: its 'close' may already be past.
      if (this.file.closed) return settle();
      this.file.once('close', settle);
      if (this.file.destroyed) return;
      if (this.gzip && !this.gzip.destroyed) this.gzip.end();
      else this.file.end();
    });
    return this.closed;
  }

  private write(line: string): void {
    if (this.closed) throw new Error(`trace ${this.path} is closed`);
    if (this.error) throw this.error;
    this.records++;
    if (this.gzip) {
      this.gzip.write(line);
      this.gzip.flush(zlib.constants.Z_SYNC_FLUSH);
    } else this.file.write(line);
  }
}
