/**
 * The limits file (src/power-limit/limits-file.ts): its lines parsed, bad ones refused with their
 * reason and fix while the rest apply, and its limits applied to VMs named by pid, UUID or name, on
 * the real limiter with a bandwidth stand-in.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { PowerLimiter } from '../../src/power-limit/limiter.js';
import { applyLimitsFile, parseLimitsFile, readLimitsFile } from '../../src/power-limit/limits-file.js';

const UUID = '8b3c1d2e-0f4a-4b5c-9d6e-7f8091a2b3c4';
const uuidBytes = Buffer.from(UUID.replaceAll('-', ''), 'hex');

function limiter(): PowerLimiter {
  return new PowerLimiter({
    open: () => {
      throw new Error('not opened in this test');
    },
    log: pino({ level: 'silent' }),
    clkTck: 100,
    domains: ['package', 'dram'],
    totalsInto: () => false,
  });
}

describe('limits file', () => {
  it('reads VM, watts and a domain (the package when left out) a line, comments and blank lines aside, and refuses each bad line with its reason and fix while the rest apply', () => {
    const f = parseLimitsFile(
      [
        '# standing limits',
        '',
        'web1 35',
        `${UUID.toUpperCase()}   12.5  # by uuid`,
        '4242 7',
        'web2',
        'web3 -3',
        'web4 1e3',
        'web1 40',
        'a b c d',
        'web1 4 dram',
        'web1 5 package',
        'web2 3 pp9',
        'web2 3 psys',
      ].join('\n'),
      '/etc/limits',
      (d) => (d === 'psys' ? 'this host does not attribute psys' : null),
    );
    expect([...f.byKey].map(([k, m]) => [k, Object.fromEntries(m)])).toEqual([
      ['web1', { package: 35, dram: 4 }],
      [UUID, { package: 12.5 }],
      ['4242', { package: 7 }],
    ]);
    expect(f.problems).toEqual([
      expect.stringMatching(
        /^cannot read line 6 of the limits file \/etc\/limits: it is not a VM and a number of watts; write 'VM WATTS \[DOMAIN\]'/,
      ),
      expect.stringMatching(/^cannot read line 7 .*: "-3" is not a number of watts above 0; give watts/),
      expect.stringMatching(/^cannot read line 8 .*: "1e3" is not a number of watts above 0/),
      expect.stringMatching(/^cannot read line 9 .*: "web1" has a package limit on an earlier line; keep one line per VM and domain/),
      expect.stringMatching(/^cannot read line 10 .*: it is not a VM and a number of watts/),
      expect.stringMatching(/^cannot read line 12 .*: "web1" has a package limit on an earlier line/),
      expect.stringMatching(/^cannot read line 13 .*: "pp9" is not a RAPL domain; name one of package, core, uncore, dram, psys/),
      expect.stringMatching(/^cannot read line 14 .*: this host does not attribute psys; remove the line or name a domain/),
    ]);
  });

  it('holds at most 4096 limits and refuses a file that is not a regular file of at most 1 MiB', () => {
    const many = Array.from({ length: 4100 }, (_, i) => `vm${i} 1`).join('\n');
    const f = parseLimitsFile(many, 'f');
    expect(f.byKey.size).toBe(4096);
    expect(f.problems).toHaveLength(4);
    expect(f.problems[0]).toMatch(/more than 4096 limits, the most the helper holds; limit fewer VMs/);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-limits-'));
    try {
      fs.writeFileSync(path.join(dir, 'big'), 'x'.repeat((1 << 20) + 1));
      for (const bad of [dir, path.join(dir, 'big'), path.join(dir, 'none')]) {
        const r = readLimitsFile(bad);
        expect(r.byKey.size).toBe(0);
        expect(r.problems[0]).toMatch(/^cannot read the limits file .*; make it a regular file the helper can read/);
      }
    } finally {
      fs.rmSync(dir, { recursive: true });
    }
  });

  it('limits the VMs it names by pid, UUID or name, leaves a limit set over v2, and removes the limits it set once it no longer names their VM', () => {
    const l = limiter();
    const vm = (vmId: number, pid: number, name: string | null, uuid: Buffer | null = null, live = true) => ({
      vmId,
      pid,
      name,
      uuid,
      live,
    });
    const vms = [vm(1, 4242, 'x'), vm(2, 500, 'other', uuidBytes), vm(3, 501, 'web1'), vm(4, 502, 'web1', null, false), vm(5, 503, 'web9')];
    l.set(5, 503, 99);
    applyLimitsFile(parseLimitsFile(`4242 7\n${UUID} 12.5\nweb1 35\nweb1 3 dram\nweb9 1\n`, 'f'), vms, l);
    expect([1, 2, 3, 4, 5].map((id) => l.view(id)?.limitW)).toEqual([7, 12.5, 35, undefined, 99]);
    expect(l.view(3, 'dram')?.limitW).toBe(3);
    // The file changed and was read again: web1's package limit gone (its dram limit now 2), the uuid's limit changed.
    applyLimitsFile(parseLimitsFile(`4242 7\n${UUID} 20\nweb1 2 dram\n`, 'f'), vms, l);
    expect([1, 2, 3, 5].map((id) => l.view(id)?.limitW)).toEqual([7, 20, undefined, 99]);
    expect(l.view(3, 'dram')?.limitW).toBe(2);
    expect(l.limited(true)).toEqual([
      [1, 'package'],
      [2, 'package'],
      [3, 'dram'],
    ]);
  });
});
