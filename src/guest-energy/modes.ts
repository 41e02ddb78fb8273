/** `--guest-energy`: what a guest reads in its MSR_PKG_ENERGY_STATUS (docs/guest-energy.md). */
export const GUEST_ENERGY_MODES = ['raw', 'exact'] as const;
export type GuestEnergyMode = (typeof GUEST_ENERGY_MODES)[number];
/** raw: the package counter, byte for byte what QEMU's own helper answers. */
export const DEFAULT_GUEST_ENERGY: GuestEnergyMode = 'raw';
/** The environment variable that sets --guest-energy when the option is not given (the systemd unit's). */
export const GUEST_ENERGY_ENV = 'VMSR_HELPER_GUEST_ENERGY';
