/**
 * Where the helper listens when not told otherwise: QEMU's default rapl-helper-socket, so a VM
 * configured for QEMU's own qemu-vmsr-helper finds this one. The daemon's -k default and every
 * client's -k default, defined once.
 */
export const DEFAULT_HELPER_SOCKET = '/var/run/qemu-vmsr-helper.sock';
