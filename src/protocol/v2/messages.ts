/**
 * Payload validation per frame type, both directions. Pure; each parser returns the one Result
 * shape (ratio/result.ts). Two kinds of refusal of a client's payload, because the protocol closes
 * the connection only for a broken frame:
 * - `fatal`: the payload has the wrong size for its type (ERROR 1, then close);
 * - otherwise: the frame is well formed but its content is not (ERROR 1, connection stays).
 */
import { E, FLAG_ENDED, T, type Frame, typeName } from './codec.js';
import { checkVcpus } from '../../ratio/vcpus.js';
import { fail, ok, type Result } from '../../ratio/result.js';
import { MAX_TID, MAX_VCPUS, type VcpuSpec } from '../../ratio/types.js';


export interface PayloadError {
  code: number;
  message: string;
  /** The framing itself is broken: answer, then close. */
  fatal: boolean;
}

export type ClientRequest =
  | { type: typeof T.REGISTER; pid: number; vcpus: VcpuSpec[] }
  | { type: typeof T.READ; vmId: number; vpkg: number }
  | { type: typeof T.SUBSCRIBE; vmId: number }
  | { type: typeof T.UNREGISTER; vmId: number };

type ClientParse = Result<ClientRequest, PayloadError>;

function wrongSize(type: number, got: number, want: string): ClientParse {
  return fail({ code: E.MALFORMED, fatal: true, message: `${typeName(type)} payload is ${got} bytes, expected ${want}` });
}

function bad(message: string): ClientParse {
  return fail({ code: E.MALFORMED, fatal: false, message });
}

/** A client's request from a decoded frame (whose type the decoder already checked). */
export function parseClientFrame(f: Frame): ClientParse {
  const p = f.payload;
  switch (f.type) {
    case T.REGISTER: {
      if (p.length < 8) return wrongSize(f.type, p.length, 'at least 8');
      const pid = p.readUInt32LE(0);
      const nvcpu = p.readUInt32LE(4);
      // A lying count is a size error: length must be exactly 8 + 8 * nvcpu.
      if (p.length !== 8 + 8 * nvcpu) return wrongSize(f.type, p.length, `8 + 8 x nvcpu (${nvcpu}) = ${8 + 8 * nvcpu}`);
      if (f.flags !== 0) return bad(`flags must be 0, got 0x${f.flags.toString(16)}`);
      // The count is checked before the list is read: the frame's size already bounds it, this keeps it cheap.
      if (nvcpu < 1 || nvcpu > MAX_VCPUS) return bad(`nvcpu must be 1..${MAX_VCPUS}, got ${nvcpu}`);
      if (pid > MAX_TID) return bad(`pid ${pid} is out of range (0..${MAX_TID})`);
      const list: VcpuSpec[] = [];
      for (let i = 0; i < nvcpu; i++) list.push({ tid: p.readUInt32LE(8 + 8 * i), vpkg: p.readUInt32LE(12 + 8 * i) });
      const vcpus = checkVcpus(list);
      if (!vcpus.ok) return bad(vcpus.error);
      return ok({ type: T.REGISTER, pid, vcpus: vcpus.value });
    }
    case T.READ:
      if (p.length !== 8) return wrongSize(f.type, p.length, '8');
      if (f.flags !== 0) return bad(`flags must be 0, got 0x${f.flags.toString(16)}`);
      return ok({ type: T.READ, vmId: p.readUInt32LE(0), vpkg: p.readUInt32LE(4) });
    case T.SUBSCRIBE:
    case T.UNREGISTER:
      if (p.length !== 4) return wrongSize(f.type, p.length, '4');
      if (f.flags !== 0) return bad(`flags must be 0, got 0x${f.flags.toString(16)}`);
      return ok({ type: f.type, vmId: p.readUInt32LE(0) });
    default:
      return fail({ code: E.MALFORMED, fatal: true, message: `unknown frame type ${typeName(f.type)}` });
  }
}

// ---- helper -> client, for the client library ----

export type HelperMessage =
  | { type: typeof T.REGISTERED; vmId: number; nvpkg: number; powerUnit: bigint }
  | { type: typeof T.VALUE; vmId: number; vpkg: number; counter: bigint; energyUj: bigint; tNs: bigint; ended: boolean }
  | { type: typeof T.UPDATE; vmId: number; tNs: bigint; vpkgs: { counter: bigint; energyUj: bigint }[]; ended: boolean }
  | { type: typeof T.OK; vmId: number }
  | { type: typeof T.ERROR; code: number; requestType: number; message: string };

/** A helper's reply; a failure describes a reply the client cannot trust (the client then closes). */
export function parseHelperFrame(f: Frame): Result<HelperMessage> {
  const p = f.payload;
  const size = (want: number) => fail(`${typeName(f.type)} payload is ${p.length} bytes, expected ${want}`);
  switch (f.type) {
    case T.REGISTERED:
      if (p.length !== 16) return size(16);
      return ok({ type: T.REGISTERED, vmId: p.readUInt32LE(0), nvpkg: p.readUInt32LE(4), powerUnit: p.readBigUInt64LE(8) });
    case T.VALUE:
      if (p.length !== 32) return size(32);
      return ok({
        type: T.VALUE,
        vmId: p.readUInt32LE(0),
        vpkg: p.readUInt32LE(4),
        counter: p.readBigUInt64LE(8),
        energyUj: p.readBigUInt64LE(16),
        tNs: p.readBigUInt64LE(24),
        ended: (f.flags & FLAG_ENDED) !== 0,
      });
    case T.UPDATE: {
      if (p.length < 16) return size(16);
      const n = p.readUInt32LE(4);
      if (p.length !== 16 + 16 * n) return size(16 + 16 * n);
      const vpkgs: { counter: bigint; energyUj: bigint }[] = [];
      for (let i = 0; i < n; i++) vpkgs.push({ counter: p.readBigUInt64LE(16 + 16 * i), energyUj: p.readBigUInt64LE(24 + 16 * i) });
      return ok({ type: T.UPDATE, vmId: p.readUInt32LE(0), tNs: p.readBigUInt64LE(8), vpkgs, ended: (f.flags & FLAG_ENDED) !== 0 });
    }
    case T.OK:
      if (p.length !== 4) return size(4);
      return ok({ type: T.OK, vmId: p.readUInt32LE(0) });
    case T.ERROR:
      if (p.length < 8) return fail(`ERROR payload is ${p.length} bytes, expected at least 8`);
      return ok({ type: T.ERROR, code: p.readUInt32LE(0), requestType: p.readUInt32LE(4), message: p.subarray(8).toString('utf8') });
    default:
      return fail(`unknown frame type ${typeName(f.type)}`);
  }
}
