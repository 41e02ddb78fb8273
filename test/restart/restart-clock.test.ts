/** The old image's times carried across a restart's exec (RESTART_CLOCK_ENV), read once by the new image. */
import { describe, expect, it } from 'vitest';
import { RESTART_CLOCK_ENV, takeRestartClock } from '../../src/helper/handover/restarter.js';

describe('takeRestartClock', () => {
  it('reads the three times and removes the variable, so a later start does not see them', () => {
    const env: NodeJS.ProcessEnv = { [RESTART_CLOCK_ENV]: JSON.stringify({ signalAt: 1.5, stoppedAt: 2, execAt: 3.25 }) };
    expect(takeRestartClock(env)).toEqual({ signalAt: 1.5, stoppedAt: 2, execAt: 3.25 });
    expect(env[RESTART_CLOCK_ENV]).toBeUndefined();
    expect(takeRestartClock(env)).toBeNull();
  });

  it('gives null for text that is not JSON, a missing time or one that is not a finite number', () => {
    for (const text of ['{', '{"signalAt":1,"stoppedAt":2}', '{"signalAt":1,"stoppedAt":2,"execAt":"3"}', 'null', '[1,2,3]']) {
      const env: NodeJS.ProcessEnv = { [RESTART_CLOCK_ENV]: text };
      expect(takeRestartClock(env), text).toBeNull();
      expect(env[RESTART_CLOCK_ENV]).toBeUndefined();
    }
  });
});
