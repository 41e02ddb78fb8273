/** fast-check arbitraries for the parts of a saved state (src/state/snapshot.ts) that tests draw alike. */
import fc from 'fast-check';
import type { VmState } from '../../src/state/snapshot.js';

/**
 * A VM's owner and flag fields (VmState): its uid, the registering connection or null (only
 * discovered), a 16-byte UUID or none, and its four flags. Spread into the record of a VmState
 * arbitrary; the fields that differ between tests (name, counts, vCPUs) stay there.
 */
export const vmOwnershipArbitraries = {
  uid: fc.nat({ max: 0xffffffff }),
  owner: fc.option(fc.nat({ max: 0xfffffffe }), { nil: null }),
  discovered: fc.boolean(),
  uuid: fc.option(
    fc.uint8Array({ minLength: 16, maxLength: 16 }).map((a) => Buffer.from(a)),
    { nil: null },
  ),
  wholeVmOnly: fc.boolean(),
  live: fc.boolean(),
  baseline: fc.boolean(),
} satisfies { [K in keyof VmState]?: fc.Arbitrary<VmState[K]> };
