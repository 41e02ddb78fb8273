/**
 * Runs after every test file (vitest setupFiles): a helper whose start outlived its beforeAll's
 * timeout was never handed to the file's afterAll, and would serve on for ever; it ends here.
 */
import { afterAll } from 'vitest';
import { stopLeftHelpers } from '../daemon/support/daemon-process.js';

afterAll(stopLeftHelpers, 30_000);
