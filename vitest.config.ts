import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    reporters: ['default', './test/support/summary-reporter.ts'],
    setupFiles: ['./test/support/leftover-helpers.ts'],
    // Outside systemd the helper runs under its keeper by default (docs/daemon.md "Crashes"); the tests
    // drive the serving process itself (its pid, its signals, its exit), and the keeper's tests ask for
    // it with --keeper (which wins over this) or start without this variable.
    env: { VMSR_HELPER_NO_KEEPER: '1' },
  },
});
