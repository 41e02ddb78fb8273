/**
 * npm run bench: runs every benchmark and prints its numbers. Never fails on timing; a benchmark
 * that cannot run here says why.
 */
const suites = ['./legacy.js', './sampling.js', './replay.js', './service.js'];

for (const suite of suites) {
  let mod: { run?: () => Promise<void> };
  try {
    mod = (await import(suite)) as { run?: () => Promise<void> };
  } catch (e) {
    console.log(`\n== ${suite}: not available (${(e as Error).message.split('\n')[0]})`);
    continue;
  }
  if (typeof mod.run !== 'function') continue;
  try {
    await mod.run();
  } catch (e) {
    console.log(`\n== ${suite}: could not run here: ${(e as Error).message}`);
  }
}
