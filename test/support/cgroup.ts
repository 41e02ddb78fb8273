/** A cgroup v1 group a test made, removed once the processes it moved there are gone. */
import fs from 'node:fs';

/** Removes `dir` once its last task has left (a killed process leaves it when the kernel reaps it), within 10 s. */
export function removeGroup(dir: string): void {
  for (const end = Date.now() + 10_000; ;) {
    try {
      return fs.rmdirSync(dir);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EBUSY' || Date.now() > end) throw e;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20);
    }
  }
}
