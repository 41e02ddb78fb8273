/** A VM's UPDATE frame from its published output (the one encoding of it: fan-out, SUBSCRIBE, OBSERVE, drop). */
import { encodeUpdate } from '../../protocol/v2/codec.js';
import type { VmOutput } from '../../ratio/outputs.js';

export interface VmUpdateFrame {
  /** The UPDATE, with the domain block (FLAG_DOMAINS) only for a client that asked; each layout encoded once. */
  frame(domains: boolean): Buffer;
  /** The VM ended: this is its last UPDATE. */
  ended: boolean;
}

/** VM `vmId`'s UPDATE from `out`; `ended` overrides the output's flag (a VM being dropped gets a last UPDATE with ENDED). */
export function vmUpdate(vmId: number, out: VmOutput, ended = out.ended): VmUpdateFrame {
  const values = out.vpkgs.map((v) => ({ counter: BigInt(v.counter), energyUj: v.energyUj }));
  const made: { plain?: Buffer; domains?: Buffer } = {};
  return {
    ended,
    frame(domains) {
      if (!domains) return (made.plain ??= encodeUpdate(vmId, out.tNs, values, ended));
      const d = (out.domains ?? []).map((x) => ({ domain: x.domain, vpkgEnergyUj: x.vpkgEnergyUj }));
      return (made.domains ??= encodeUpdate(vmId, out.tNs, values, ended, d));
    },
  };
}

/** VM `vmId`'s UPDATE now, or null when the loop has no such VM. */
export function currentUpdate(engine: { output(vmId: number): VmOutput | undefined }, vmId: number): VmUpdateFrame | null {
  const out = engine.output(vmId);
  return out ? vmUpdate(vmId, out) : null;
}
