/**
 * Every -k default: QEMU's default rapl-helper-socket, so a VM set up for qemu-vmsr-helper finds this one. QEMU
 * writes /var/run/qemu-vmsr-helper.sock: the same file, /var/run being a link to /run on every systemd host.
 */
export const DEFAULT_HELPER_SOCKET = '/run/qemu-vmsr-helper.sock';
