/**
 * Where the helper listens when not told otherwise: QEMU's default rapl-helper-socket, so a VM
 * configured for QEMU's own qemu-vmsr-helper finds this one. The daemon's -k default and every
 * client's -k default, defined once. QEMU writes it /var/run/qemu-vmsr-helper.sock: the same file, /var/run
 * being a link to /run on every systemd host (the units' ListenStream= and the docs say /run).
 */
export const DEFAULT_HELPER_SOCKET = '/run/qemu-vmsr-helper.sock';
