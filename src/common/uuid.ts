/** 16 raw bytes (RFC 4122 order, as QEMU's -uuid and the v2 wire carry them) as a lowercase 8-4-4-4-12 UUID. */
export function formatUuid(b: Uint8Array): string {
  const h = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
}
