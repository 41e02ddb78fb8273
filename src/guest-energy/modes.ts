/** `--guest-energy`: what a guest reads in its MSR_PKG_ENERGY_STATUS (docs/guest-energy.md). */
export const GUEST_ENERGY_MODES = ['raw', 'exact'] as const;
export type GuestEnergyMode = (typeof GUEST_ENERGY_MODES)[number];
/** raw: the package counter, byte for byte what QEMU's own helper answers. */
export const DEFAULT_GUEST_ENERGY: GuestEnergyMode = 'raw';
