/** The textual forms of the addresses Node gives for a socket's ends, taken apart in one place. */

/** The four numbers of an IPv4 address, also written IPv4-mapped (`::ffff:a.b.c.d`); else null. */
export function ipv4Octets(address: string): number[] | null {
  const m = /^(?:::ffff:)?(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/i.exec(address);
  return m ? m.slice(1).map(Number) : null;
}

/** The eight groups of an IPv6 address, `::` expanded (no zone, no embedded IPv4); else null. */
export function ipv6Groups(address: string): string[] | null {
  if (!address.includes(':') || address.includes('.') || address.includes('%')) return null;
  const [head, tail = ''] = address.split('::') as [string, string?];
  const h = head === '' ? [] : head.split(':');
  const t = tail === '' ? [] : tail.split(':');
  const groups = address.includes('::') ? [...h, ...Array<string>(Math.max(0, 8 - h.length - t.length)).fill('0'), ...t] : h;
  return groups.length === 8 && groups.every((g) => /^[0-9a-f]{1,4}$/i.test(g)) ? groups : null;
}
