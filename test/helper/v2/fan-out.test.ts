/**
 * Clients and FanOut without sockets: the clients are recording Subscribers (the interface both
 * receive; V2Connection is the real one, tested in connection.test.ts and test/v2/).
 */
import { describe, expect, it } from 'vitest';
import { Clients, watch, type Subscriber } from '../../../src/helper/v2/clients.js';
import { FanOut, type SampleFrames } from '../../../src/helper/v2/fan-out.js';
import { E, HELPER_TYPES, T } from '../../../src/protocol/v2/codec.js';
import { FrameDecoder } from '../../../src/protocol/v2/frame-decoder.js';
import { parseHelperFrame } from '../../../src/protocol/v2/messages.js';
import type { VmUpdateFrame } from '../../../src/helper/v2/vm-update-frame.js';

class Recorder implements Subscriber {
  readonly subscriptions = new Set<number>();
  readonly domainSubscriptions = new Set<number>();
  readonly peer: { uid: number };
  /** Frames sent, each batch a group. */
  readonly batches: Buffer[][] = [];
  readonly sent: Buffer[] = [];
  /** send() fails from this frame on (the connection was dropped for its backlog). */
  failFrom = Infinity;

  constructor(
    readonly id: number,
    uid = 1000,
  ) {
    this.peer = { uid };
  }

  send(frame: Buffer): boolean {
    if (this.sent.length >= this.failFrom) return false;
    this.sent.push(frame);
    this.batches.at(-1)?.push(frame);
    return true;
  }

  batch(fn: () => void): void {
    this.batches.push([]);
    fn();
  }
}

function setup(...recorders: Recorder[]) {
  const holds: boolean[] = [];
  const clients = new Clients<Recorder>((on) => holds.push(on));
  for (const r of recorders) clients.add(r, { connId: r.id, uid: r.peer.uid, seesAll: false });
  return { clients, holds, fanOut: new FanOut(clients) };
}

/** Frames made by tag, counting how often each was made. */
function frames(ended: ReadonlySet<number> = new Set()): SampleFrames & { made: string[] } {
  const made: string[] = [];
  return {
    made,
    update(vmId): VmUpdateFrame | null {
      made.push(`vm${vmId}`);
      return vmId >= 100 ? null : { frame: (d) => Buffer.from(`vm${vmId}${d ? 'd' : ''}`), ended: ended.has(vmId) };
    },
    host(perPackage, domains) {
      const tag = `host${perPackage ? '+' : ''}${domains ? 'd' : ''}`;
      made.push(tag);
      return Buffer.from(tag);
    },
  };
}

const text = (b: Buffer[]) => b.map((f) => f.toString());

describe('FanOut.sample', () => {
  it("sends each connection its VMs' UPDATEs then its HOST_UPDATE in one batch, each frame made once for all", () => {
    const [a, b, idle] = [new Recorder(1), new Recorder(2), new Recorder(3)];
    const { clients, fanOut } = setup(a, b, idle);
    a.subscriptions.add(1).add(2);
    b.subscriptions.add(2);
    clients.subscribeHost(a, true);
    clients.subscribeHost(b, false);
    const f = frames();
    fanOut.sample(f);
    expect(a.batches.map(text)).toEqual([['vm1', 'vm2', 'host+']]);
    expect(b.batches.map(text)).toEqual([['vm2', 'host']]);
    expect(idle.batches).toEqual([]);
    expect(f.made.sort()).toEqual(['host', 'host+', 'vm1', 'vm2']);
  });

  it("sends an ended VM's last UPDATE and forgets it; a VM without output is skipped and kept", () => {
    const a = new Recorder(1);
    const { fanOut } = setup(a);
    a.subscriptions.add(1).add(2).add(100);
    fanOut.sample(frames(new Set([2])));
    expect(text(a.sent)).toEqual(['vm1', 'vm2']);
    expect([...a.subscriptions]).toEqual([1, 100]);
    fanOut.sample(frames());
    expect(text(a.sent)).toEqual(['vm1', 'vm2', 'vm1']);
  });

  it("stops a connection's batch at the first frame it could not send, and goes on with the others", () => {
    const [a, b] = [new Recorder(1), new Recorder(2)];
    const { clients, fanOut } = setup(a, b);
    a.failFrom = 1;
    for (const r of [a, b]) {
      r.subscriptions.add(1).add(2);
      clients.subscribeHost(r, false);
    }
    fanOut.sample(frames());
    expect(text(a.sent)).toEqual(['vm1']);
    expect(text(b.sent)).toEqual(['vm1', 'vm2', 'host']);
  });
});

describe('FanOut.sample with the other RAPL domains', () => {
  it('sends each connection the layout it asked for, per VM and for the host, each layout made once; an ended VM forgets the choice', () => {
    const [a, b, c] = [new Recorder(1), new Recorder(2), new Recorder(3)];
    const { clients, fanOut } = setup(a, b, c);
    watch(a, 1, true);
    watch(a, 2, false);
    watch(b, 1, false);
    watch(c, 1, true);
    watch(c, 2, true);
    // A second SUBSCRIBE replaces the choice.
    watch(c, 2, false);
    clients.subscribeHost(a, true, true);
    clients.subscribeHost(b, true);
    clients.subscribeHost(c, false, true);
    const f = frames(new Set([1]));
    fanOut.sample(f);
    expect(text(a.sent)).toEqual(['vm1d', 'vm2', 'host+d']);
    expect(text(b.sent)).toEqual(['vm1', 'host+']);
    expect(text(c.sent)).toEqual(['vm1d', 'vm2', 'hostd']);
    expect(f.made.sort()).toEqual(['host+', 'host+d', 'hostd', 'vm1', 'vm2']);
    expect([...a.domainSubscriptions, ...c.domainSubscriptions]).toEqual([]);
  });
});

describe('FanOut.dropped and FanOut.failed', () => {
  it("gives a dropped VM's last frame only to the connections watching it, which stop watching", () => {
    const [a, b] = [new Recorder(1), new Recorder(2)];
    const { fanOut } = setup(a, b);
    a.subscriptions.add(5).add(6);
    fanOut.dropped(5, { frame: (d) => Buffer.from(`last5${d ? 'd' : ''}`), ended: true });
    expect(text(a.sent)).toEqual(['last5']);
    expect([...a.subscriptions]).toEqual([6]);
    expect(b.sent).toEqual([]);
  });

  it("gives a dropped VM's last frame in the layout each connection asked for, and forgets its domain choice", () => {
    const [a, b] = [new Recorder(1), new Recorder(2)];
    const { fanOut } = setup(a, b);
    watch(a, 5, true);
    watch(b, 5, false);
    fanOut.dropped(5, { frame: (d) => Buffer.from(`last5${d ? 'd' : ''}`), ended: true });
    expect(text(a.sent)).toEqual(['last5d']);
    expect(text(b.sent)).toEqual(['last5']);
    expect([...a.subscriptions, ...a.domainSubscriptions]).toEqual([]);
  });

  it('sends one ERROR 5 notice to each subscriber of a VM or of the host, none to the others', () => {
    const [vm, host, idle] = [new Recorder(1), new Recorder(2), new Recorder(3)];
    const { clients, fanOut } = setup(vm, host, idle);
    vm.subscriptions.add(1);
    clients.subscribeHost(host, true);
    fanOut.failed(new Error('short read'));
    for (const r of [vm, host]) {
      expect(r.sent).toHaveLength(1);
      const [f] = new FrameDecoder(HELPER_TYPES).push(r.sent[0]!);
      const m = f?.ok ? parseHelperFrame(f.value) : null;
      expect(m?.ok && m.value).toEqual({
        type: T.ERROR,
        code: E.ENERGY_SOURCE,
        requestType: T.SUBSCRIBE,
        message: 'sampling failed: short read; updates resume when it recovers',
      });
    }
    expect(idle.sent).toEqual([]);
  });
});

describe('Clients', () => {
  it('holds the loop for the first host subscriber and lets go with the last, a second HOST_SUBSCRIBE changing only the layout', () => {
    const [a, b] = [new Recorder(1), new Recorder(2)];
    const { clients, holds } = setup(a, b);
    clients.subscribeHost(a, false);
    clients.subscribeHost(a, true);
    clients.subscribeHost(b, false);
    expect(holds).toEqual([true]);
    expect([...clients].map((c) => c.hostPerPackage)).toEqual([true, false]);
    clients.remove(a);
    expect(holds).toEqual([true]);
    clients.remove(b);
    expect(holds).toEqual([true, false]);
    expect(clients.remove(b)).toBe(false);
    expect(clients.size).toBe(0);
  });

  it("gives a connection's viewer, and one seeing only its own uid for a connection it does not know", () => {
    const a = new Recorder(1, 500);
    const { clients } = setup();
    clients.add(a, { connId: 1, uid: 500, seesAll: true });
    expect(clients.viewerOf(a).seesAll).toBe(true);
    clients.remove(a);
    expect(clients.viewerOf(a)).toEqual({ connId: 1, uid: 500, seesAll: false });
  });

  it('numbers connections from where it was told', () => {
    const clients = new Clients<Recorder>(() => {}, 7);
    expect([clients.newId(), clients.newId(), clients.newId()]).toEqual([7, 8, 9]);
  });
});
