/**
 * Ends the run with a plain "N passed, N failed, N skipped" line that CI reads, after listing every
 * skipped test with its reason, so nothing is skipped silently.
 */
import type { Reporter, TestModule } from 'vitest/node';

export default class SummaryReporter implements Reporter {
  onTestRunEnd(testModules: ReadonlyArray<TestModule>, unhandledErrors: ReadonlyArray<unknown>): void {
    let passed = 0;
    let failed = 0;
    let skipped = 0;
    const skips: string[] = [];
    for (const mod of testModules) {
      if (mod.state() === 'failed' && [...mod.children.allTests()].length === 0) failed++;
      for (const test of mod.children.allTests()) {
        const r = test.result();
        if (r.state === 'passed') passed++;
        else if (r.state === 'failed') failed++;
        else {
          skipped++;
          const note = r.state === 'skipped' ? r.note : undefined;
          skips.push(`  ${mod.moduleId.replace(process.cwd() + '/', '')} > ${test.fullName}${note ? `: ${note}` : ''}`);
        }
      }
    }
    failed += unhandledErrors.length;
    if (skips.length) process.stdout.write(`\nskipped tests and why:\n${skips.join('\n')}\n`);
    process.stdout.write(`\n${passed} passed, ${failed} failed, ${skipped} skipped\n`);
  }
}
