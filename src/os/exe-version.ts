/**
 * The QEMU version of a process, read from its executable: the text after "QEMU emulator version "
 * in the binary (QEMU's --version string is one literal in it). The executable is /proc/<pid>/exe
 * when the helper may open it, else the absolute argv[0]. Both are a local process's choice, so the
 * file must be a regular file (opened without blocking, checked with fstat), at most
 * MAX_EXE_BYTES are scanned, and each executable (device, inode, size, mtime) is scanned once.
 * Asynchronous, in 1 MiB reads: nothing waits on it.
 */
import fs from 'node:fs';

/** An executable past this size is not scanned (QEMU's is about 30 MB). */
const MAX_EXE_BYTES = 256 << 20;
const CHUNK = 1 << 20;

const cache = new Map<string, string | null>();

/** The text following `mark` (up to 64 bytes, to the first NUL or newline) in the process's executable, or null. */
export async function exeVersionText(procRoot: string, pid: number, mark: string): Promise<string | null> {
  for (const file of await candidates(procRoot, pid)) {
    let fh: fs.promises.FileHandle;
    try {
      fh = await fs.promises.open(file, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
    } catch {
      continue;
    }
    try {
      const st = await fh.stat();
      if (!st.isFile() || st.size > MAX_EXE_BYTES) return null;
      const key = `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}`;
      if (!cache.has(key)) cache.set(key, await scan(fh, st.size, Buffer.from(mark, 'latin1')));
      return cache.get(key)!;
    } finally {
      await fh.close();
    }
  }
  return null;
}

async function candidates(procRoot: string, pid: number): Promise<string[]> {
  const out = [`${procRoot}/${pid}/exe`];
  try {
    const argv0 = (await fs.promises.readFile(`${procRoot}/${pid}/cmdline`, 'latin1')).split('\0')[0] ?? '';
    if (argv0.startsWith('/')) out.push(argv0);
  } catch {
    /* gone */
  }
  return out;
}

async function scan(fh: fs.promises.FileHandle, size: number, mark: Buffer): Promise<string | null> {
  const buf = Buffer.alloc(CHUNK + mark.length + 64);
  let carry = 0;
  for (let pos = 0; pos < size; pos += CHUNK) {
    const { bytesRead } = await fh.read(buf, carry, CHUNK, pos);
    const end = carry + bytesRead;
    const at = buf.subarray(0, end).indexOf(mark);
    if (at >= 0) {
      const tail = Buffer.alloc(64);
      const { bytesRead: n } = await fh.read(tail, 0, 64, pos - carry + at + mark.length);
      const text = tail.subarray(0, n).toString('latin1');
      return text.split(/[\0\n]/)[0] ?? '';
    }
    // Keep the last bytes: the mark may straddle two reads.
    carry = Math.min(end, mark.length - 1);
    buf.copy(buf, 0, end - carry, end);
    if (bytesRead === 0) break;
  }
  return null;
}
