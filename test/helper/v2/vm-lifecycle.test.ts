/**
 * VmLifecycle with a real registry and a real ratio engine (as the loop it drives), no sockets: drop,
 * release, end, and how long an ended discovered VM stays listed. Discovery is a recorder of the
 * pids it is told to forget and the vCPU list it gives back.
 */
import { describe, expect, it } from 'vitest';
import { RatioEngine } from '../../../src/ratio/attribution.js';
import type { HostInfo } from '../../../src/model/host.js';
import type { VcpuSpec } from '../../../src/model/vcpus.js';
import { VmRegistry, procView } from '../../../src/helper/v2/vm-registry.js';
import { DEFAULT_V2_LIMITS } from '../../../src/helper/v2/v2-limits.js';
import { ENDED_DISCOVERED_KEPT_SAMPLES, VmLifecycle } from '../../../src/helper/v2/vm-lifecycle.js';
import { HELPER_TYPES, T } from '../../../src/protocol/v2/codec.js';
import { FrameDecoder } from '../../../src/protocol/v2/frame-decoder.js';
import { parseHelperFrame } from '../../../src/protocol/v2/messages.js';

const host: HostInfo = { vendor: 'intel', clkTck: 100, cpus: [{ cpu: 0, pkg: 0 }], packages: [{ pkg: 0, powerUnit: 0xa0e03n }] };
const meta = { name: null, uuid: null, wholeVmOnly: false };

function setup(current: { vcpus: VcpuSpec[]; wholeVmOnly: boolean } | null = null) {
  const registry = new VmRegistry(DEFAULT_V2_LIMITS, procView('/proc'));
  const engine = new RatioEngine(host);
  const forgotten: number[] = [];
  const last: [number, Buffer][] = [];
  const lifecycle = new VmLifecycle({
    registry,
    sampling: { engine, unregister: (vmId) => engine.unregister(vmId) },
    discovery: { forget: (pid) => forgotten.push(pid), current: () => current },
    lastUpdate: (vmId, u) => last.push([vmId, u.frame(false)]),
  });
  /** A VM in the engine and the registry: registered by connection `owner`, or only discovered (null). */
  const vm = (pid: number, owner: number | null) => {
    const spec = { pid, starttime: 1, vcpus: [{ tid: pid, vpkg: 0 }] };
    const vmId = engine.register(spec);
    if (owner === null) registry.addDiscovered(vmId, pid, 1, 0, meta);
    else registry.add(owner, vmId, spec, 0);
    return vmId;
  };
  return { registry, engine, lifecycle, forgotten, last, vm };
}

function decode(frame: Buffer) {
  const [f] = new FrameDecoder(HELPER_TYPES).push(frame);
  const m = f?.ok ? parseHelperFrame(f.value) : null;
  if (!m?.ok) throw new Error('not a frame');
  return m.value;
}

describe('VmLifecycle', () => {
  it('drops a VM: its last UPDATE says ENDED, it is no longer sampled nor listed, discovery examines its pid afresh', () => {
    const s = setup();
    const id = s.vm(501, null);
    s.lifecycle.drop(id);
    expect(s.last).toHaveLength(1);
    expect(decode(s.last[0]![1])).toMatchObject({ type: T.UPDATE, vmId: id, ended: true });
    expect(s.registry.get(id)).toBeUndefined();
    expect(s.engine.activePids()).not.toContain(501);
    expect(s.forgotten).toEqual([501]);
    expect(s.lifecycle.changed).toBe(true);
  });

  it('keeps a live discovered VM its registrant lets go, with the vCPU list discovery gives back', () => {
    const s = setup({ vcpus: [{ tid: 502, vpkg: 0 }], wholeVmOnly: true });
    const id = s.vm(502, null);
    s.registry.add(1, id, { pid: 502, starttime: 1, vcpus: [] }, 0);
    s.lifecycle.release(id);
    expect(s.registry.get(id)).toMatchObject({ owner: null, discovered: true, wholeVmOnly: true });
    expect(s.last).toEqual([]);
    expect(s.lifecycle.changed).toBe(true);
  });

  it('drops a VM only registered when its registrant lets go', () => {
    const s = setup();
    const id = s.vm(503, 1);
    s.lifecycle.release(id);
    expect(s.registry.get(id)).toBeUndefined();
    expect(s.last.map(([v]) => v)).toEqual([id]);
    expect(s.forgotten).toEqual([]);
  });

  it(`keeps an ended discovered VM listed ${ENDED_DISCOVERED_KEPT_SAMPLES} samples, then drops it; a registered one stays`, () => {
    const s = setup();
    const found = s.vm(504, null);
    const registered = s.vm(505, 1);
    s.lifecycle.ended([found, registered]);
    expect(s.forgotten).toEqual([504]);
    expect(s.registry.get(found)?.live).toBe(false);
    for (let i = 0; i < ENDED_DISCOVERED_KEPT_SAMPLES; i++) s.lifecycle.age();
    expect(s.registry.get(found)).toBeDefined();
    s.lifecycle.age();
    expect(s.registry.get(found)).toBeUndefined();
    expect(s.registry.get(registered)).toBeDefined();
  });
});
