/**
 * The QEMU version of a process, from its executable (the --version string is a literal in it), opening no path a process
 * chose (docs/security.md, "Exact mode's peers"): looked up with O_PATH (no device or FIFO opened), checked by fstat, read
 * through that fd. /proc/<pid>/exe, else an absolute argv[0] that is an installed program; each scanned once.
 */
import fs from 'node:fs';

/** An executable past this size is not scanned (QEMU's is about 30 MB). */
const MAX_EXE_BYTES = 256 << 20;
const CHUNK = 1 << 20;

/** Executables whose text is kept (the oldest forgotten past it): processes choose their executables. */
const MAX_CACHED = 64;
const cache = new Map<string, string | null>();

/** The text following `mark` (up to 64 bytes, to the first NUL or newline) in the process's executable, or null. */
export async function exeVersionText(procRoot: string, pid: number, mark: string): Promise<string | null> {
  const exe = await openChecked(`${procRoot}/${pid}/exe`, false);
  const file = exe ?? (await openChecked(await absoluteArgv0(procRoot, pid), true));
  if (file === null) return null;
  try {
    const key = `${file.st.dev}:${file.st.ino}:${file.st.size}:${file.st.mtimeMs}`;
    if (!cache.has(key)) {
      const text = await scan(file.fh, file.st.size, Buffer.from(mark, 'latin1'));
      if (cache.size >= MAX_CACHED) cache.delete(cache.keys().next().value!);
      cache.set(key, text);
    }
    return cache.get(key)!;
  } finally {
    await file.fh.close();
  }
}

/** O_PATH (Linux): a lookup that opens nothing; fstat works on it. */
const O_PATH = 0o10000000;
/** An installed QEMU is tens of MB; a file of /proc or /sys says 0 or 4096. */
const MIN_EXE_BYTES = 1 << 20;

/** `file` opened for reading once its lookup is a regular file within bounds (a `chosen` one, an installed program). */
async function openChecked(file: string | null, chosen: boolean): Promise<{ fh: fs.promises.FileHandle; st: fs.Stats } | null> {
  if (file === null) return null;
  let lookup: fs.promises.FileHandle;
  try {
    lookup = await fs.promises.open(file, O_PATH);
  } catch {
    return null;
  }
  try {
    const st = await lookup.stat();
    if (!st.isFile() || st.size > MAX_EXE_BYTES) return null;
    if (chosen && (st.uid !== 0 || (st.mode & 0o022) !== 0 || (st.mode & 0o111) === 0 || st.size < MIN_EXE_BYTES)) return null;
    const { O_RDONLY, O_NONBLOCK, O_NOCTTY } = fs.constants;
    const fh = await fs.promises.open(`/proc/self/fd/${lookup.fd}`, O_RDONLY | O_NONBLOCK | O_NOCTTY);
    return { fh, st };
  } catch {
    return null;
  } finally {
    await lookup.close();
  }
}

async function absoluteArgv0(procRoot: string, pid: number): Promise<string | null> {
  try {
    const argv0 = (await fs.promises.readFile(`${procRoot}/${pid}/cmdline`, 'latin1')).split('\0')[0] ?? '';
    return argv0.startsWith('/') ? argv0 : null;
  } catch {
    return null; // gone
  }
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
