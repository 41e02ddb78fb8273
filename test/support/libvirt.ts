/**
 * libvirt for tests: libvirtd started when not running (without systemd as PID 1:
 * `virtlogd -d; libvirtd -d`, as on this machine), transient domains booting the spin guest, each
 * destroyed by the test. A libvirtd this module started is left running for other tests (it is
 * shared by every test on the machine); domains are always destroyed.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { hasKvm, isRoot, which } from './env.js';
import { SPIN_ELF, type GuestMode } from './qemu.js';

const URI = 'qemu:///system';

/** Why libvirt domains cannot run here, or null. */
export function libvirtMissing(): string | null {
  if (!isRoot()) return 'needs root (libvirtd, qemu:///system)';
  for (const c of ['virsh', 'libvirtd', 'virtlogd']) {
    if (!which(c) && !fs.existsSync(`/usr/sbin/${c}`))
      return `${c} not installed (apt-get install -t bookworm-backports libvirt-daemon-system libvirt-clients)`;
  }
  if (!fs.existsSync(SPIN_ELF)) return `guest kernel ${SPIN_ELF} missing`;
  return null;
}

function virsh(args: string[], timeoutMs = 60_000): string {
  return execFileSync('virsh', ['-c', URI, ...args], { encoding: 'utf8', timeout: timeoutMs, stdio: ['ignore', 'pipe', 'pipe'] });
}

function libvirtdAnswers(): boolean {
  return spawnSync('virsh', ['-c', URI, 'version'], { timeout: 10_000, stdio: 'ignore' }).status === 0;
}

/** Starts virtlogd and libvirtd when libvirtd does not answer; waits until it does. */
export async function ensureLibvirtd(): Promise<void> {
  if (libvirtdAnswers()) return;
  fs.mkdirSync('/var/log/libvirt', { recursive: true });
  fs.mkdirSync('/var/run/libvirt', { recursive: true });
  spawnSync('virtlogd', ['-d'], { stdio: 'ignore' });
  spawnSync('libvirtd', ['-d'], { stdio: 'ignore' });
  const deadline = Date.now() + 30_000;
  while (!libvirtdAnswers()) {
    if (Date.now() > deadline) throw new Error('libvirtd did not answer within 30 s of `libvirtd -d`');
    await new Promise((r) => setTimeout(r, 200));
  }
}

export interface Domain {
  name: string;
  uuid: string;
  /** QEMU's pid. */
  pid: number;
  destroy(): void;
}

/** A kernel copy libvirt-qemu can read (0755 dir, 0644 file): the repo may sit under a private path. */
export function guestKernelDir(): { dir: string; kernel: string; remove(): void } {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-libvirt-'));
  fs.chmodSync(dir, 0o755);
  const kernel = path.join(dir, 'spin.elf');
  fs.copyFileSync(SPIN_ELF, kernel);
  fs.chmodSync(kernel, 0o644);
  return { dir, kernel, remove: () => fs.rmSync(dir, { recursive: true, force: true }) };
}

/** A transient domain: `vcpus` vCPUs in `sockets` sockets, the spin guest in `mode`; `devices` more device XML, `uuid` its UUID. */
export function createDomain(o: {
  name: string;
  kernel: string;
  mode: GuestMode;
  vcpus: number;
  sockets: number;
  dir: string;
  devices?: string;
  uuid?: string;
}): Domain {
  const uuid = o.uuid ?? crypto.randomUUID();
  const cores = o.vcpus / o.sockets;
  const xml = `<domain type='${hasKvm() ? 'kvm' : 'qemu'}'>
  <name>${o.name}</name>
  <uuid>${uuid}</uuid>
  <memory unit='MiB'>64</memory>
  <vcpu>${o.vcpus}</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><kernel>${o.kernel}</kernel><cmdline>mode=${o.mode}</cmdline></os>
  <cpu><topology sockets='${o.sockets}' dies='1' cores='${cores}' threads='1'/></cpu>
  <features><acpi/></features>
  <devices><emulator>/usr/bin/qemu-system-x86_64</emulator>${o.devices ?? ''}</devices>
</domain>
`;
  const file = path.join(o.dir, `${o.name}.xml`);
  fs.writeFileSync(file, xml);
  virsh(['create', file]);
  let destroyed = false;
  const destroy = () => {
    if (destroyed) return;
    destroyed = true;
    spawnSync('virsh', ['-c', URI, 'destroy', o.name], { stdio: 'ignore', timeout: 60_000 });
  };
  try {
    const pidFile = `/var/run/libvirt/qemu/${o.name}.pid`;
    const pid = Number(fs.readFileSync(pidFile, 'utf8').trim());
    if (!Number.isSafeInteger(pid) || pid <= 0) throw new Error(`no pid in ${pidFile}`);
    return { name: o.name, uuid, pid, destroy };
  } catch (e) {
    destroy();
    throw e;
  }
}
