/** MSR device access: one fd per CPU, opened once (before privileges drop), read with pread at offset = MSR number. */
import fs from 'node:fs';
import { msrPath } from './host-paths.js';
import { msrErrnoHint } from './errno-hints.js';
import { errnoName } from '../os/libc/errno.js';
import { closeFd, pread } from '../os/libc/fds.js';
import { cannot } from '../common/errors.js';
import { describeMsr } from './registers.js';

/** Where a user learns how a fake MSR tree is laid out; named by every short-read error. */
export const FAKE_MSR_TREE_DOC = 'docs/try-it.md "A fake MSR tree"';

/** Why a pread of `msr` gave `n` bytes: the msr driver never does (it fails with EIO), so the file is a fake MSR tree's, too short. */
function shortReadMessage(cpu: number, msr: number, n: number, file: string, fd: number): string {
  let size: string;
  try {
    const st = fs.fstatSync(fd);
    if (st.isCharacterDevice())
      return cannot(`read MSR 0x${msr.toString(16)} on CPU ${cpu}`, `short read (${n} bytes) from the device ${file}`);
    size = `${st.size} bytes long`;
  } catch {
    size = 'of unknown length';
  }
  return cannot(
    `read MSR 0x${msr.toString(16)} on CPU ${cpu}`,
    `short read (${n} bytes): ${file} is a file (not the msr driver's device), ${size}, and the register's 8 bytes would end at ` +
      `byte ${msr + 8}, so it does not hold ${describeMsr(msr)}`,
    'a fake MSR tree must hold each register the host reads as 8 little-endian bytes at offset = MSR number of each ' +
      "CPU's file, in the layout of the vendor the helper runs as (--vendor intel or amd; auto takes this machine's CPU) " +
      `(${FAKE_MSR_TREE_DOC})`,
  );
}

export class MsrReadError extends Error {
  constructor(
    message: string,
    readonly cpu: number,
    readonly msr: number,
    readonly code?: string,
  ) {
    super(message);
  }
}

export class MsrDevice {
  private readonly fds = new Map<number, number>();
  private readonly buf = Buffer.alloc(8);

  constructor(private readonly template: string) {}

  path(cpu: number): string {
    return msrPath(this.template, cpu);
  }

  /** Opens (or returns the cached fd of) the device of `cpu`. Throws the fs error, e.g. ENOENT/EACCES. */
  open(cpu: number): number {
    let fd = this.fds.get(cpu);
    if (fd === undefined) {
      fd = fs.openSync(this.path(cpu), fs.constants.O_RDONLY);
      this.fds.set(cpu, fd);
    }
    return fd;
  }

  /** Takes over an fd of `cpu`'s device opened elsewhere (before a privilege drop and exec). */
  adopt(cpu: number, fd: number): void {
    this.fds.set(cpu, fd);
  }

  openFds(): [number, number][] {
    return [...this.fds];
  }

  isOpen(cpu: number): boolean {
    return this.fds.has(cpu);
  }

  /** Throws MsrReadError when the device or register cannot be read. */
  read(cpu: number, msr: number): bigint {
    this.pread8(cpu, msr);
    return this.buf.readBigUInt64LE(0);
  }

  /** The register's little-endian bytes (the legacy reply's encoding) to out[offset..offset+8). */
  readInto(cpu: number, msr: number, out: Buffer, offset: number): void {
    this.pread8(cpu, msr);
    this.buf.copy(out, offset, 0, 8);
  }

  private pread8(cpu: number, msr: number): void {
    let fd: number;
    try {
      fd = this.open(cpu);
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      throw new MsrReadError(cannot(`open ${this.path(cpu)}`, err.code ?? err.message), cpu, msr, err.code);
    }
    // libc's pread through koffi: Node's fs.readSync costs more than the read itself on this path.
    const n = pread(fd, this.buf, 8, msr);
    if (n < 0) {
      const code = errnoName(-n);
      throw new MsrReadError(cannot(`read MSR 0x${msr.toString(16)} on CPU ${cpu}`, code), cpu, msr, code);
    }
    if (n !== 8) throw new MsrReadError(shortReadMessage(cpu, msr, n, this.path(cpu), fd), cpu, msr);
  }

  close(): void {
    for (const fd of this.fds.values()) closeFd(fd);
    this.fds.clear();
  }
}

/** An MSR error (or an error caused by one) rewritten to name the fix, and `alternative` after it. */
export function msrErrorWithHint(e: unknown, alternative?: string): Error {
  const msr = e instanceof MsrReadError ? e : e instanceof Error && e.cause instanceof MsrReadError ? e.cause : undefined;
  if (!msr) return e instanceof Error ? e : new Error(String(e));
  const hint = msrErrnoHint(msr.code);
  if (!hint) return e as Error;
  return new Error(`${msr.message}: ${hint.why}; ${hint.fix}${alternative ? `, or ${alternative}` : ''}`);
}
