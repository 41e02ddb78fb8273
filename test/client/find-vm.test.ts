/** The rule that turns `watch NAME|UUID|PID` into one listed VM (src/client/find-vm.ts), on LIST entries. */
import { describe, expect, it } from 'vitest';
import { findVm, MAX_CANDIDATES_SHOWN, MAX_NAMES_SHOWN } from '../../src/client/find-vm.js';
import type { VmInfo } from '../../src/client/v2-replies.js';

const UUID_A = '5e1f0a3c-1d2e-4f60-8a9b-0c1d2e3f4a5b';
const UUID_B = '00000000-1111-4222-8333-444444444444';

function vm(o: Partial<VmInfo> & { hostVmId: number; pid: number }): VmInfo {
  return { uid: 0, starttime: 1n, name: null, uuid: null, source: 'discovered', nvpkg: 1, ended: false, wholeVmOnly: false, ...o };
}

describe('findVm', () => {
  it('findVm takes a number as a pid first, a UUID in any case, then a name', () => {
    const vms = [
      vm({ hostVmId: 1, pid: 4242, name: 'web', uuid: UUID_A }),
      vm({ hostVmId: 2, pid: 5000, name: '4242' }), // a name that looks like the other's pid
      vm({ hostVmId: 3, pid: 6000, name: '7777' }),
    ];
    expect(findVm(vms, '4242', 'w').hostVmId).toBe(1);
    expect(findVm(vms, '7777', 'w').hostVmId).toBe(3); // no such pid: the name
    expect(findVm(vms, UUID_A.toUpperCase(), 'w').hostVmId).toBe(1);
    expect(findVm(vms, 'web', 'w').hostVmId).toBe(1);
    expect(() => findVm(vms, 'Web', 'w')).toThrow(/no VM has that pid, UUID or name/); // names are exact
  });

  it('findVm prefers a live VM to an ended one of the same name, and takes an ended one when it is all there is', () => {
    const ended = vm({ hostVmId: 1, pid: 10, name: 'db', ended: true });
    const live = vm({ hostVmId: 2, pid: 11, name: 'db' });
    expect(findVm([ended, live], 'db', 'watch').hostVmId).toBe(2);
    expect(findVm([ended], 'db', 'watch').hostVmId).toBe(1);
  });

  it('findVm refuses a shared name listing each candidate, and suggests the UUID only when the UUIDs tell them apart', () => {
    const a = vm({ hostVmId: 1, pid: 10, name: 'db', uuid: UUID_A, uid: 64055 });
    const b = vm({ hostVmId: 2, pid: 11, name: 'db', uuid: UUID_B, uid: 1000 });
    expect(() => findVm([a, b], 'db', 'vmsr-helper watch')).toThrow(
      `cannot find the VM "db": 2 VMs match; pick one by its PID (vmsr-helper watch 10) or its UUID (vmsr-helper watch ${UUID_A}); a process that is not your VM can wear its name and UUID, never its PID:\n  "db" pid 10 uid 64055 uuid ${UUID_A} discovered\n  "db" pid 11 uid 1000 uuid ${UUID_B} discovered`,
    );
    const copy = { ...b, uuid: UUID_A };
    expect(() => findVm([a, copy], 'db', 'w')).toThrow(/pick one by its PID \(w 10\); a process that is not your VM/);
  });

  it('findVm lists at most MAX_CANDIDATES_SHOWN candidates and MAX_NAMES_SHOWN names, and counts the rest', () => {
    const many = Array.from({ length: MAX_CANDIDATES_SHOWN + 5 }, (_, i) => vm({ hostVmId: i + 1, pid: 100 + i, name: 'x' }));
    let msg = '';
    try {
      findVm(many, 'x', 'w');
    } catch (e) {
      msg = (e as Error).message;
    }
    expect(msg.match(/\n {2}"x" pid/g)).toHaveLength(MAX_CANDIDATES_SHOWN);
    expect(msg).toContain(`${MAX_CANDIDATES_SHOWN + 5} VMs match;`);
    expect(msg.endsWith('\n  and 5 more')).toBe(true);
    const named = Array.from({ length: MAX_NAMES_SHOWN + 2 }, (_, i) => vm({ hostVmId: i + 1, pid: 100 + i, name: `vm${i}` }));
    expect(() => findVm(named, 'nope', 'w')).toThrow(/the VMs you may see are "vm0", .*"vm9" and 2 more\)/);
    // Hostile text in a name is quoted, never raw.
    expect(() => findVm([vm({ hostVmId: 1, pid: 1, name: 'a"b' })], 'zz', 'w')).toThrow(/are "a\\"b"\)/);
  });
});
