/**
 * Names that mark a QEMU/KVM process and its vCPU threads. Pure. A thread's name is its comm (15
 * bytes at most, set by the process itself: anything may be in it, including spaces and ')').
 */

/** `CPU <n>/KVM` (or `CPU <n>/TCG` without KVM): QEMU's vCPU thread name with debug-threads=on (libvirt always turns it on). */
const VCPU_RE = /^CPU (\d{1,5})\/(?:KVM|TCG)$/;

/** The vCPU index in a thread name, or null when the name is not a vCPU thread's. */
export function vcpuIndexOf(comm: string): number | null {
  const m = VCPU_RE.exec(comm);
  return m ? Number(m[1]) : null;
}

/**
 * A process name or executable base name that QEMU/KVM runs under: qemu-system-<arch> (comm cuts it
 * to 15 bytes: "qemu-system-x86"), qemu-kvm (RHEL's /usr/libexec/qemu-kvm), kvm (Proxmox, Debian's
 * old wrapper).
 */
export function isQemuName(name: string): boolean {
  return name.startsWith('qemu-system-') || name === 'qemu-kvm' || name === 'kvm';
}

/** Base name of a path-like argv[0] or exe link. */
export function baseName(p: string): string {
  const i = p.lastIndexOf('/');
  return i < 0 ? p : p.slice(i + 1);
}
