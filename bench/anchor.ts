/**
 * The anchor: QEMU's own C qemu-vmsr-helper, run on the same fake MSR files as ours. It reads
 * /dev/cpu/N/msr and checks /sys/class/powercap/intel-rapl/enabled, so it runs in a private mount
 * namespace (unshare -m) where the fake files are bind-mounted over /dev/cpu. On a host that is not
 * Intel it refuses to start; bench/anchor/qemu-vmsr-helper-anyhost.gdb gets Debian's 10.0.2 build
 * past that one check. When any of this is missing, the bench says "anchor unavailable" and why.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { BENCH_SRC } from './tools.js';

export const C_HELPER = '/usr/bin/qemu-vmsr-helper';
/** The only build the gdb script's offset fits. */
const GDB_BUILD = '1:10.0.2+ds-2+deb13u1~bpo12+1';

export interface Anchor {
  pid: number;
  socket: string;
  stop(): void;
}

function has(cmd: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${cmd}`]).status === 0;
}

/** Why the anchor cannot run here, or null when it can; `gdb` says whether the vendor check needs it. */
export function anchorProblem(): { problem: string } | { gdb: boolean } {
  if (!fs.existsSync(C_HELPER)) return { problem: `${C_HELPER} not installed (apt-get install -t bookworm-backports qemu-system-common)` };
  if (process.getuid?.() !== 0) return { problem: 'needs root (a private mount namespace for /dev/cpu)' };
  if (!has('unshare')) return { problem: 'unshare (util-linux) not installed' };
  const intel = /GenuineIntel/.test(fs.readFileSync('/proc/cpuinfo', 'utf8'));
  if (intel) return { gdb: false };
  const v = spawnSync('dpkg-query', ['-W', '-f', '${Version}', 'qemu-system-common'], { encoding: 'utf8' }).stdout?.trim();
  if (v !== GDB_BUILD)
    return {
      problem: `host is not Intel, and the gdb work-around fits qemu-system-common ${GDB_BUILD} only (installed: ${v || 'unknown'})`,
    };
  if (!has('gdb')) return { problem: 'host is not Intel and gdb (needed to pass its vendor check) is not installed' };
  return { gdb: true };
}

/** Starts the C helper on `devCpu` (a folder of N/msr files), listening on `socket`. */
export async function startAnchor(devCpu: string, socket: string, gdb: boolean): Promise<Anchor> {
  const log = path.join(path.dirname(socket), 'anchor.log');
  const script = path.join(BENCH_SRC, 'anchor', 'start-in-namespace.sh');
  const gdbScript = gdb ? path.join(BENCH_SRC, 'anchor', 'qemu-vmsr-helper-anyhost.gdb') : '-';
  const r = spawnSync('unshare', ['-m', '--propagation', 'private', 'sh', script, devCpu, socket, gdbScript, log], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  const m = /process (\d+)\) detached/.exec(r.stdout ?? '');
  if (r.status !== 0 || !m)
    throw new Error(`the C helper did not start: ${(r.stderr || r.stdout || '').trim().split('\n').slice(-3).join(' / ')}`);
  const pid = Number(m[1]);
  const end = Date.now() + 10_000;
  while (!fs.existsSync(socket)) {
    if (Date.now() > end) throw new Error(`the C helper (pid ${pid}) did not listen on ${socket}: ${fs.readFileSync(log, 'utf8').trim()}`);
    await new Promise((res) => setTimeout(res, 10));
  }
  return {
    pid,
    socket,
    stop() {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        /* gone already */
      }
    },
  };
}
