import { defineConfig } from 'vitest/config';
import base from './vitest.config.js';

/**
 * `npm run test:fast`: the pure tests (no daemon, no child process, no QEMU), under 2 minutes on the
 * 2-core machine (CONTRIBUTING.md). `npm test` runs everything.
 */
export default defineConfig({
  test: {
    ...base.test,
    include: [
      'test/ratio/**/*.test.ts',
      'test/protocol/**/*.test.ts',
      'test/common/**/*.test.ts',
      'test/state/**/*.test.ts',
      'test/stats/stats-format.test.ts',
      'test/trace/*.test.ts',
      'test/sampling/**/*.test.ts',
      'test/helper/v2/dispatch.test.ts',
      'test/helper/server/*.test.ts',
      'test/exporter/*.test.ts',
      'test/os/subordinate-uids.test.ts',
    ],
    exclude: [
      '**/replay-cli.test.ts',
      '**/domains-live.test.ts',
      '**/*.exporter.test.ts',
      '**/*.prometheus.test.ts',
      '**/observer-group-refusal.test.ts',
      '**/unit.test.ts',
      '**/tls-recipe.test.ts',
    ],
  },
});
