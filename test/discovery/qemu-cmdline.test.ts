import { describe, expect, it } from 'vitest';
import {
  MAX_CMDLINE_BYTES,
  machinePrefersSockets,
  parseQemuCommandLine,
  parseQemuOpts,
  parseSmp,
  splitCmdline,
  socketOf,
} from '../../src/discovery/qemu-cmdline.js';
import { commOf, isQemuName, parseProcessStat, PF_KTHREAD, vcpuIndexOf } from '../../src/discovery/names.js';

const topo = (text: string, preferSockets = false) => {
  const t = parseSmp(text, preferSockets);
  if ('error' in t) throw new Error(t.error);
  return t;
};

describe('-smp as QEMU 10 computes it', () => {
  it('fills cores, not sockets, when sockets= is absent (machine types since 6.2)', () => {
    expect(topo('8')).toEqual({ cpus: 8, maxcpus: 8, sockets: 1, perSocket: 8 });
    expect(topo('8,threads=2')).toEqual({ cpus: 8, maxcpus: 8, sockets: 1, perSocket: 8 });
  });

  it('fills sockets for machine types before 6.2', () => {
    expect(topo('8', true)).toEqual({ cpus: 8, maxcpus: 8, sockets: 8, perSocket: 1 });
    expect(topo('8,cores=2', true)).toEqual({ cpus: 8, maxcpus: 8, sockets: 4, perSocket: 2 });
    expect(machinePrefersSockets('pc-i440fx-6.1')).toBe(true);
    expect(machinePrefersSockets('pc-q35-5.2')).toBe(true);
    expect(machinePrefersSockets('pc-q35-6.2')).toBe(false);
    expect(machinePrefersSockets('q35')).toBe(false);
    expect(machinePrefersSockets(null)).toBe(false);
  });

  it("takes libvirt's full form, with dies and clusters", () => {
    expect(topo('4,sockets=2,dies=1,clusters=1,cores=2,threads=1')).toEqual({ cpus: 4, maxcpus: 4, sockets: 2, perSocket: 2 });
    expect(topo('8,sockets=2,dies=2,cores=2,threads=1')).toEqual({ cpus: 8, maxcpus: 8, sockets: 2, perSocket: 4 });
  });

  it('computes sockets from cores, and maxcpus for hotplug', () => {
    expect(topo('2,maxcpus=8,cores=2')).toEqual({ cpus: 2, maxcpus: 8, sockets: 4, perSocket: 2 });
    expect(topo('sockets=2,cores=3')).toEqual({ cpus: 6, maxcpus: 6, sockets: 2, perSocket: 3 });
  });

  it('refuses what QEMU refuses, and hostile values', () => {
    for (const bad of [
      '0',
      '4,sockets=3',
      '4,maxcpus=2',
      'cpus=4,foo=1',
      '4,sockets=x',
      '4,sockets=-1',
      '999999999',
      '5000',
      '512,sockets=512',
    ]) {
      expect('error' in parseSmp(bad, false)).toBe(true);
    }
  });

  it('socketOf gives the vCPU index over the vCPUs per socket', () => {
    const t = topo('8,sockets=2,cores=2,threads=2');
    expect([0, 3, 4, 7].map((n) => socketOf(t, n))).toEqual([0, 0, 1, 1]);
  });
});

describe('command line', () => {
  it('reads -name guest=, -name X, -uuid and -smp, the last one winning', () => {
    const c = parseQemuCommandLine([
      '/usr/bin/qemu-system-x86_64',
      '-name',
      'guest=web,,1,debug-threads=on',
      '-uuid',
      '0D1E2F3A-4B5C-6D7E-8F90-A1B2C3D4E5F6',
      '-smp',
      '1',
      '-smp',
      '4,sockets=2',
    ]);
    expect(c.name).toBe('web,1');
    expect(c.uuid!.toString('hex')).toBe('0d1e2f3a4b5c6d7e8f90a1b2c3d4e5f6');
    expect(c.topology.sockets).toBe(2);
    expect(parseQemuCommandLine(['kvm', '--name', 'plain,process=x']).name).toBe('plain');
  });

  it('without -smp, -name or -uuid: one vCPU in one socket, no name, no UUID', () => {
    const c = parseQemuCommandLine(['qemu-system-x86_64', '-m', '64']);
    expect(c).toMatchObject({ name: null, uuid: null, topology: { sockets: 1, perSocket: 1 }, problems: [] });
  });

  it('a bad -uuid or -smp is reported and falls back, never throws', () => {
    const c = parseQemuCommandLine(['qemu-kvm', '-uuid', 'not-a-uuid', '-smp', '4,sockets=3']);
    expect(c.uuid).toBeNull();
    expect(c.topology.sockets).toBe(1);
    expect(c.problems).toHaveLength(2);
  });

  it('takes no name that holds control characters or is too long', () => {
    expect(parseQemuCommandLine(['qemu-kvm', '-name', 'a\nb\x1b[31m']).name).toBeNull();
    expect(parseQemuCommandLine(['qemu-kvm', '-name', 'x'.repeat(257)]).name).toBeNull();
  });

  it('splits NUL-separated bytes and drops an argument cut at the bound', () => {
    expect(splitCmdline(Buffer.from('qemu\0-name\0x\0'))).toEqual(['qemu', '-name', 'x']);
    expect(splitCmdline(Buffer.alloc(0))).toEqual([]);
    const long = Buffer.concat([Buffer.from('qemu\0'), Buffer.alloc(MAX_CMDLINE_BYTES, 0x41)]);
    expect(splitCmdline(long)).toEqual(['qemu']);
  });

  it('QEMU option syntax: implied key, doubled commas', () => {
    expect([...parseQemuOpts('a,,b,x=1,y=', 'guest')]).toEqual([
      ['guest', 'a,b'],
      ['x', '1'],
      ['y', ''],
    ]);
  });
});

describe('names and stat lines', () => {
  it('knows vCPU thread names and QEMU process names', () => {
    expect(vcpuIndexOf('CPU 12/KVM')).toBe(12);
    expect(vcpuIndexOf('CPU 0/TCG')).toBe(0);
    for (const n of ['CPU x/KVM', 'CPU 1/KVM ', 'xCPU 1/KVM', 'CPU 123456/KVM', 'IO mon_iothread']) expect(vcpuIndexOf(n)).toBeNull();
    for (const n of ['qemu-system-x86', 'qemu-kvm', 'kvm']) expect(isQemuName(n)).toBe(true);
    for (const n of ['kvm-pit/1234', 'qemu-img', 'kvmx', 'python3']) expect(isQemuName(n)).toBe(false);
  });

  it('parses a stat line whose comm holds spaces and parentheses', () => {
    const fields = Array.from({ length: 50 }, (_, i) => String(i + 3));
    fields[9 - 3] = String(PF_KTHREAD);
    fields[20 - 3] = '7';
    fields[22 - 3] = '123456';
    const line = `42 (a) b (c)) ${fields.join(' ')}`;
    expect(parseProcessStat(line)).toEqual({ comm: 'a) b (c)', flags: PF_KTHREAD, numThreads: 7, starttime: 123456, exitSignal: 38 });
    fields[38 - 3] = '-1'; // a thread that is not its process's main one
    expect(parseProcessStat(`42 (a) b (c)) ${fields.join(' ')}`)?.exitSignal).toBe(-1);
    fields[38 - 3] = '-x';
    expect(parseProcessStat(`42 (a) b (c)) ${fields.join(' ')}`)).toBeNull();
    expect(commOf(line)).toBe('a) b (c)');
    expect(parseProcessStat('42 (x) S 1 2')).toBeNull();
    expect(parseProcessStat('garbage')).toBeNull();
  });
});
