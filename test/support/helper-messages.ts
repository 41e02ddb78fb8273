/** The helper's v2 messages in a buffer of whole frames, for tests that read a socket's bytes; a bad frame throws. */
import { HELPER_TYPES, type DaemonCounters } from '../../src/protocol/v2/codec.js';
import { FrameDecoder } from '../../src/protocol/v2/frame-decoder.js';
import { parseHelperFrame, type HelperMessage } from '../../src/protocol/v2/messages.js';

export function helperMessages(buf: Buffer): HelperMessage[] {
  return new FrameDecoder(HELPER_TYPES).push(buf).map((f) => {
    if (!f.ok) throw new Error(f.error.message);
    const m = parseHelperFrame(f.value);
    if (!m.ok) throw new Error(m.error);
    return m.value;
  });
}

/** HOST_UPDATE's daemon counters, every one 0 but those given. */
export function hostStats(some: Partial<DaemonCounters> = {}): DaemonCounters {
  return {
    legacyOk: 0n,
    legacyRefused: 0n,
    legacyFailed: 0n,
    lastSampleDurationNs: 0n,
    samples: 0n,
    sampleFailures: 0n,
    connections: 0,
    vms: 0,
    ...some,
  };
}
