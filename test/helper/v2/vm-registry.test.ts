/**
 * VmRegistry on the real /proc, with real processes: who may register which process (the peer
 * itself, root, the process's uid), the admission refusals and limits, who sees which VM (root and
 * the observer group, the VM's uid, the registering connection), and a registration taking over the
 * discovered VM of the same process. The peer is the credentials SO_PEERCRED would give.
 */
import fs from 'node:fs';
import { spawn } from 'node:child_process';
import { afterEach, describe, expect, it } from 'vitest';
import { VmRegistry, procView } from '../../../src/helper/v2/vm-registry.js';
import { DEFAULT_V2_LIMITS, type V2Limits } from '../../../src/helper/v2/v2-limits.js';
import { fail } from '../../../src/common/result.js';
import { startChild, threadsOf, type TestChild } from '../../v2/harness.js';
import { isRoot } from '../../support/env.js';

const proc = procView('/proc');
const me = process.pid;
const myUid = process.getuid!();
/** A uid that owns none of the processes here. */
const OTHER_UID = myUid === 4242 ? 4243 : 4242;

const children: TestChild[] = [];
afterEach(async () => {
  for (const c of children.splice(0)) await c.kill();
});

function child(): TestChild {
  const c = startChild('sleep');
  children.push(c);
  return c;
}

function registry(limits: Partial<V2Limits> = {}, fds?: ConstructorParameters<typeof VmRegistry>[2]): VmRegistry {
  return new VmRegistry({ ...DEFAULT_V2_LIMITS, ...limits }, proc, fds);
}

const myVcpus = () =>
  threadsOf(me)
    .slice(0, 1)
    .map((tid) => ({ tid, vpkg: 0 }));

type Admission = ReturnType<VmRegistry['admit']>;

function admitted(a: Admission) {
  if (!a.ok) throw new Error(`refused: ${a.error.message}`);
  return a.value;
}

function refused(a: Admission) {
  if (a.ok) throw new Error('admitted');
  return a.error;
}

describe('VmRegistry: who may register which process', () => {
  it('admits the peer registering itself (pid 0), whatever its uid, with its starttime and owner', () => {
    const r = registry();
    const a = admitted(r.admit(1, { pid: me, uid: OTHER_UID }, { pid: 0, vcpus: myVcpus() }));
    expect(a.spec.pid).toBe(me);
    expect(a.spec.starttime).toBe(proc.starttime(me));
    expect(a.uid).toBe(myUid);
    expect(a.attachTo).toBeUndefined();
  });

  it('refuses the peer "registering itself" when its pid now names another process (pid reuse), and admits it with the start time it connected with', () => {
    const r = registry();
    const start = proc.starttime(me)!;
    expect(admitted(r.admit(1, { pid: me, uid: OTHER_UID, starttime: start }, { pid: 0, vcpus: myVcpus() })).spec.pid).toBe(me);
    for (const starttime of [start + 1, null]) {
      const no = refused(r.admit(1, { pid: me, uid: OTHER_UID, starttime }, { pid: 0, vcpus: myVcpus() }));
      expect(no.reason).toBe('not-permitted');
      expect(no.message).toContain('the process that connected has exited; its pid now names another process');
    }
  });

  it("admits root and the process's own uid registering another process, and refuses any other uid (not-permitted)", () => {
    const c = child();
    const req = { pid: c.pid, vcpus: [{ tid: c.pid, vpkg: 0 }] };
    const r = registry();
    expect(r.admit(1, { pid: me, uid: 0 }, req).ok).toBe(true);
    expect(r.admit(1, { pid: me, uid: myUid }, req).ok).toBe(true);
    const no = refused(r.admit(1, { pid: me, uid: OTHER_UID }, req));
    expect(no.reason).toBe('not-permitted');
    expect(no.message).toContain(`process ${c.pid} belongs to uid ${myUid}`);
  });

  it('refuses a tid that is not a thread of the process (not-permitted)', () => {
    const c = child();
    const no = refused(registry().admit(1, { pid: me, uid: 0 }, { pid: me, vcpus: [{ tid: c.pid, vpkg: 0 }] }));
    expect(no).toEqual({ reason: 'not-permitted', message: `tid ${c.pid} is not a thread of process ${me}` });
  });

  it('refuses a process that does not exist (process-gone), and pid 0 from a peer whose pid is unknown', async () => {
    const c = child();
    const gonePid = c.pid;
    await c.kill();
    expect(refused(registry().admit(1, { pid: me, uid: 0 }, { pid: gonePid, vcpus: [] })).reason).toBe('process-gone');
    expect(refused(registry().admit(1, { pid: 0, uid: 0 }, { pid: 0, vcpus: [] })).reason).toBe('not-permitted');
  });

  it('refuses past the limits: vCPUs per VM, VMs per connection, VMs in all', () => {
    const [a, b, c] = [child(), child(), child()];
    const req = (t: TestChild) => ({ pid: t.pid, vcpus: [{ tid: t.pid, vpkg: 0 }] });
    const root = { pid: me, uid: 0 };
    const r = registry({ maxVcpus: 1, maxVmsPerConnection: 1, maxVms: 2 });
    expect(
      refused(
        r.admit(1, root, {
          pid: me,
          vcpus: threadsOf(me)
            .slice(0, 2)
            .map((tid) => ({ tid, vpkg: 0 })),
        }),
      ).reason,
    ).toBe('limit');
    r.add(1, 1, admitted(r.admit(1, root, req(a))).spec, myUid);
    expect(refused(r.admit(1, root, req(b))).message).toContain('this connection already has 1 VMs registered (limit 1)');
    r.add(2, 2, admitted(r.admit(2, root, req(b))).spec, myUid);
    expect(refused(r.admit(3, root, req(c))).message).toContain('the helper already has 2 VMs registered (limit 2)');
    expect(r.size).toBe(2);
  });

  it('refuses a second registration of a process, live or ended, until the first is removed', () => {
    const c = child();
    const req = { pid: c.pid, vcpus: [{ tid: c.pid, vpkg: 0 }] };
    const root = { pid: me, uid: 0 };
    const r = registry();
    r.add(1, 10, admitted(r.admit(1, root, req)).spec, myUid);
    expect(refused(r.admit(2, root, req)).message).toContain('is already registered (vm_id 10)');
    r.markEnded(10);
    expect(refused(r.admit(2, root, req)).message).toContain('still has an ended registration');
    r.remove(10);
    expect(r.admit(2, root, req).ok).toBe(true);
  });

  it("refuses a process whose threads do not fit the fd budget, saying why with the budget's words", () => {
    const c = child();
    const seen: number[] = [];
    const r = registry({}, { canAdmit: (n) => (seen.push(n), fail('12 fds left')) });
    const no = refused(r.admit(1, { pid: me, uid: 0 }, { pid: c.pid, vcpus: [{ tid: c.pid, vpkg: 0 }] }));
    expect(no).toEqual({ reason: 'limit', message: `cannot register process ${c.pid}: 12 fds left` });
    expect(seen).toEqual([1]); // sleep has one thread
  });
});

describe('VmRegistry: a registration of a discovered process', () => {
  it('attaches to the live discovered VM of the same process, without asking the fd budget', () => {
    const r = registry({}, { canAdmit: () => fail('no fds') });
    const start = proc.starttime(me)!;
    r.addDiscovered(7, me, start, myUid, { name: 'guest', uuid: null, wholeVmOnly: true });
    const a = admitted(r.admit(1, { pid: me, uid: myUid }, { pid: 0, vcpus: myVcpus() }));
    expect(a.attachTo).toBe(7);
    const rec = r.add(1, 7, a.spec, a.uid);
    expect(rec).toMatchObject({ vmId: 7, owner: 1, discovered: true, name: 'guest', wholeVmOnly: false });
    expect(r.total).toBe(1);
    // UNREGISTER of a live discovered VM: it stays, discovered again.
    expect(r.release(7)).toBe(true);
    expect(r.get(7)).toMatchObject({ owner: null, discovered: true });
    expect(r.size).toBe(0);
  });

  it('does not attach to a discovered VM of an earlier process with the same pid (another starttime)', () => {
    const r = registry();
    r.addDiscovered(7, me, proc.starttime(me)! - 1, myUid, { name: null, uuid: null, wholeVmOnly: false });
    expect(admitted(r.admit(1, { pid: me, uid: myUid }, { pid: 0, vcpus: myVcpus() })).attachTo).toBeUndefined();
  });

  it('gives its whole state as copies of its records, in id order', () => {
    const r = registry();
    const st = proc.starttime(me)!;
    r.addDiscovered(4, 1004, st, 0, { name: 'b', uuid: Buffer.from([1, 2]), wholeVmOnly: false });
    r.add(5, 2, { pid: 1002, starttime: st, vcpus: [], name: 'a' }, 1000);
    const state = r.state();
    expect(state.map((v) => [v.vmId, v.owner, v.pid, v.name, v.discovered])).toEqual([
      [2, 5, 1002, 'a', false],
      [4, null, 1004, 'b', true],
    ]);
    state[1]!.uuid![0] = 9;
    state[1]!.live = false;
    expect(r.get(4)).toMatchObject({ live: true, uuid: Buffer.from([1, 2]) });
  });

  it('drops a registered VM nobody discovered when its registrant lets go (release false)', () => {
    const r = registry();
    const a = admitted(r.admit(1, { pid: me, uid: 0 }, { pid: 0, vcpus: myVcpus() }));
    r.add(1, 3, a.spec, a.uid);
    expect(r.vmsOf(1)).toEqual([3]);
    expect(r.release(3)).toBe(false);
    expect(r.vmsOf(1)).toEqual([]);
  });
});

describe('VmRegistry: who sees which VM', () => {
  function populated(): VmRegistry {
    const r = registry();
    const st = proc.starttime(me)!;
    // VM 1: registered by connection 5 for a process of OTHER_UID; VM 2: discovered, owned by uid 0; VM 3: discovered, OTHER_UID's.
    r.add(5, 1, { pid: 1001, starttime: st, vcpus: [] }, OTHER_UID);
    r.addDiscovered(2, 1002, st, 0, { name: null, uuid: null, wholeVmOnly: false });
    r.addDiscovered(3, 1003, st, OTHER_UID, { name: null, uuid: null, wholeVmOnly: false });
    return r;
  }
  const ids = (r: VmRegistry, v: Parameters<VmRegistry['visible']>[0], from = 1) => r.visible(v, from).map((x) => x.vmId);

  it('shows root and the observer group (seesAll) every VM, in id order from the id asked', () => {
    const r = populated();
    expect(ids(r, { connId: 9, uid: 0, seesAll: true })).toEqual([1, 2, 3]);
    expect(ids(r, { connId: 9, uid: 1234, seesAll: true }, 2)).toEqual([2, 3]);
    expect(r.canSee({ connId: 9, uid: 1234, seesAll: true }, 2)).toBe(true);
  });

  it('shows a peer the VMs of its own uid, and the ones its connection registered, nothing else', () => {
    const r = populated();
    expect(ids(r, { connId: 9, uid: OTHER_UID, seesAll: false })).toEqual([1, 3]);
    expect(ids(r, { connId: 5, uid: 7777, seesAll: false })).toEqual([1]);
    expect(ids(r, { connId: 9, uid: 7777, seesAll: false })).toEqual([]);
    expect(r.canSee({ connId: 9, uid: 7777, seesAll: false }, 2)).toBe(false);
    expect(r.canSee({ connId: 9, uid: 7777, seesAll: false }, 99)).toBe(false);
  });
});

describe('VmRegistry with a process of another uid', () => {
  it('refuses a non-root peer registering a process of another uid, and admits that uid', async (ctx) => {
    if (!isRoot()) return ctx.skip('needs root to start a child as uid 65534');
    const p = spawn('sleep', ['60'], { uid: 65534, gid: 65534, stdio: 'ignore' });
    const exited = new Promise<void>((r) => p.once('exit', () => r()));
    children.push({ child: p, pid: p.pid!, kill: () => (p.kill('SIGKILL'), exited) });
    expect(fs.statSync(`/proc/${p.pid}`).uid).toBe(65534);
    const req = { pid: p.pid!, vcpus: [{ tid: p.pid!, vpkg: 0 }] };
    const r = registry();
    expect(refused(r.admit(1, { pid: me, uid: 1000 }, req)).reason).toBe('not-permitted');
    expect(admitted(r.admit(1, { pid: me, uid: 65534 }, req)).uid).toBe(65534);
  });
});

describe('VmRegistry: restored from state()', () => {
  it('keeps every record and index, a REGISTER of the same process takes an awaiting registration over, another process is refused', () => {
    const c = child();
    const other = child();
    const before = registry();
    const a = admitted(before.admit(7, { pid: c.pid, uid: myUid }, { pid: c.pid, vcpus: [{ tid: c.pid, vpkg: 0 }] }));
    before.add(7, 1, a.spec, a.uid);
    const b = admitted(before.admit(7, { pid: other.pid, uid: myUid }, { pid: other.pid, vcpus: [{ tid: other.pid, vpkg: 0 }] }));
    before.add(7, 2, b.spec, b.uid);
    const after = registry();
    after.restore(before.state());
    expect(after.state()).toEqual(before.state());
    expect(after.vmsOf(7)).toEqual([1, 2]);
    expect(after.awaitingConnection()).toEqual([1, 2]);
    expect(() => after.restore(before.state())).toThrow(/only an empty registry can be restored/);
    // Connection 9 (of the new process) registers the same process: it takes VM 1 over, the old owner loses it.
    const again = admitted(after.admit(9, { pid: c.pid, uid: myUid }, { pid: c.pid, vcpus: [{ tid: c.pid, vpkg: 0 }] }));
    expect(again.attachTo).toBe(1);
    after.add(9, 1, again.spec, again.uid);
    expect(after.vmsOf(9)).toEqual([1]);
    expect(after.vmsOf(7)).toEqual([2]);
    expect(after.awaitingConnection()).toEqual([2]);
    // Taken over, VM 1 is no longer awaiting: a second REGISTER of it is refused as usual.
    expect(refused(after.admit(10, { pid: c.pid, uid: myUid }, { pid: c.pid, vcpus: [{ tid: c.pid, vpkg: 0 }] })).message).toMatch(
      /is already registered \(vm_id 1\)/,
    );
    // Released when nobody came for it, as a closed connection's: not discovered, so it goes.
    expect(after.release(2)).toBe(false);
    expect(after.awaitingConnection()).toEqual([]);
  });
});
