/** The helper's v2 messages in a buffer of whole frames, for tests that read a socket's bytes; a bad frame throws. */
import { FrameDecoder, HELPER_TYPES } from '../../src/protocol/v2/codec.js';
import { parseHelperFrame, type HelperMessage } from '../../src/protocol/v2/messages.js';

export function helperMessages(buf: Buffer): HelperMessage[] {
  return new FrameDecoder(HELPER_TYPES).push(buf).map((f) => {
    if (!f.ok) throw new Error(f.error.message);
    const m = parseHelperFrame(f.value);
    if (!m.ok) throw new Error(m.error);
    return m.value;
  });
}
