/** What the v2 service needs from discovery: the ProcScanner's side of it (its scan steps any iterator, for tests' fakes). */
import type { DiscoveredVm, ProcScanner } from '../../discovery/scanner.js';

export type Discovery = Pick<
  ProcScanner,
  'trackedVms' | 'maxVms' | 'refine' | 'forget' | 'current' | 'defer' | 'state' | 'restore' | 'adopt'
> & { scanSteps(): Iterator<DiscoveredVm | null> };
