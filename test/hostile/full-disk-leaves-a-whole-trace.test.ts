/**
 * A local user fills the file system the trace is written to. `--record` stopped
 * for good and left the trace cut mid-record, which replay rejects. Here a real 256 KiB tmpfs is
 * filled by a process of uid nobody while `vmsr-helper record` writes to it: the trace must replay
 * while the disk is full, and recording must resume (with a gap record) once space is freed.
 */
import { execFile, execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { BIN, hostArgs, spawnHelper, waitFor } from '../daemon/support/daemon-process.js';
import { ThreadedProcess } from '../support/threads.js';
import { fakeHost, NOBODY, notRoot, onCleanup, sleep, track } from './support.js';

const TMPFS_SIZE = '256k';
/**
 * Threads of the recorded "VM": their stat lines (about 80 KiB a sample, more than deflate's 32 KiB
 * window) make each sample need fresh blocks, so the full disk is hit at the next sample.
 */
const VM_THREADS = 300;

/** `vmsr-helper replay --json FILE`: exit status, interval lines and stderr. */
function replay(file: string): Promise<{ code: number; intervals: number; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [BIN, 'replay', '--json', file], { maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      const intervals = stdout.split('\n').filter((l) => l.startsWith('{') && !l.includes('"total"')).length;
      resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, intervals, stderr });
    });
  });
}

describe('a full file system under --record', () => {
  test('the trace replays while the disk is full, and recording resumes with a gap record once space is freed', async (ctx) => {
    const why = notRoot() ?? (spawnSync('mount', ['--version']).status === 0 ? null : 'mount(8) not installed');
    if (why) return ctx.skip(why);
    const { host, dir } = fakeHost();
    fs.chmodSync(dir, 0o755); // the attacker reaches the mount through it
    const mnt = path.join(dir, 'small');
    fs.mkdirSync(mnt);
    try {
      execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${TMPFS_SIZE},mode=0755`, 'vmsr-hostile', mnt]);
    } catch (e) {
      return ctx.skip(`cannot mount a tmpfs here: ${(e as Error).message}`);
    }
    onCleanup(() => void spawnSync('umount', ['-l', mnt]));
    const pub = path.join(mnt, 'pub');
    fs.mkdirSync(pub);
    fs.chmodSync(pub, 0o1777);
    const trace = path.join(mnt, 'trace.jsonl.gz');

    const vm = new ThreadedProcess();
    onCleanup(() => vm.kill());
    await vm.ready();
    await vm.cmd(`start ${VM_THREADS}`);
    const rec = track(spawnHelper(['record', '--pid', String(vm.pid), '--vcpus', `${vm.pid}:0`, '-o', trace, ...hostArgs(host)]));
    await waitFor(() => (fs.statSync(trace, { throwIfNoEntry: false })?.size ?? 0) > 1000, 'the recorder to write its baseline', rec);
    await sleep(2_500); // two more samples (one a second)

    // The attacker: uid nobody fills every free block.
    const fill = path.join(pub, 'fill');
    const filler = spawnSync('sh', ['-c', `cat /dev/zero > ${fill}`], { uid: NOBODY, gid: NOBODY });
    expect(filler.stderr.toString()).toMatch(/No space left/);
    await waitFor(() => rec.stderr().includes('recording paused: disk full'), 'the recorder to pause', rec);
    await sleep(2_500); // more samples dropped meanwhile (one a second)

    const full = await replay(trace);
    expect(full.stderr).toBe('');
    expect(full.code).toBe(0);
    expect(full.intervals).toBeGreaterThan(0);
    expect(rec.stderr().match(/recording paused/g)).toHaveLength(1);

    fs.rmSync(fill);
    await waitFor(() => rec.stderr().includes('recording resumed'), 'the recorder to resume', rec);
    await sleep(2_500);
    expect(await rec.stop('SIGTERM')).toBe(0);

    const after = await replay(trace);
    expect(after.code).toBe(0);
    expect(after.intervals).toBeGreaterThan(full.intervals);
    expect(after.stderr).toMatch(/samples missing from here \(the recorder's disk was full\)/);
  }, 60_000);
});
