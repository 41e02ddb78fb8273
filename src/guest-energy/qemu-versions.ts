/** `kvm_msr_energy_thread` arrived in 9.1 and its arithmetic is the same to 11.0 (docs/guest-energy.md "Versions"). */
const MODELLED_QEMU: readonly string[] = ['9.1', '9.2', '10.0', '10.1', '10.2', '11.0'];

/** In QEMU's executable, for `--version` ("QEMU emulator version 10.0.2 (Debian ...)"). */
export const QEMU_VERSION_MARK = 'QEMU emulator version ';

export function parseQemuVersion(text: string): string | null {
  const m = /^(\d{1,3})\.(\d{1,3})(?:\.(\d{1,3}))?/.exec(text);
  return m ? `${Number(m[1])}.${Number(m[2])}.${Number(m[3] ?? 0)}` : null;
}

export function isModelled(version: string): boolean {
  const [major, minor] = version.split('.');
  return MODELLED_QEMU.includes(`${major}.${minor}`);
}
