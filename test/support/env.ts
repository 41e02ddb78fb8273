/** What this machine can do, for tests that need it; each answer comes with the reason to skip. */
import fs from 'node:fs';
import { execFileSync } from 'node:child_process';

export function isRoot(): boolean {
  return process.getuid?.() === 0;
}

export function hasKvm(): boolean {
  try {
    fs.accessSync('/dev/kvm', fs.constants.R_OK | fs.constants.W_OK);
    return true;
  } catch {
    return false;
  }
}

export function which(cmd: string): string | null {
  try {
    return execFileSync('sh', ['-c', `command -v ${cmd}`], { encoding: 'utf8' }).trim() || null;
  } catch {
    return null;
  }
}

/** Why a test needing `what` cannot run here, or null when it can. */
export function missing(what: { root?: boolean; qemu?: boolean; command?: string }): string | null {
  if (what.root && !isRoot()) return 'needs root (CI runs as root)';
  if (what.qemu && !which('qemu-system-x86_64')) return 'qemu-system-x86_64 not installed (apt-get install qemu-system-x86)';
  if (what.command && !which(what.command)) return `${what.command} not installed`;
  return null;
}
