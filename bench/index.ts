/**
 * npm run bench: runs every benchmark and prints its numbers. Never fails on timing; a benchmark
 * that cannot run here says why. Each suite runs in a fresh Node process, so memory figures are its
 * own and not what an earlier suite left on the heap. `npm run bench -- replay` runs one suite.
 */
import { spawnSync } from 'node:child_process';
import { NO_KEEPER_ENV } from '../src/keeper/keeper-messages.js';

const all = [
  'compare',
  'sampling',
  'domains',
  'replay',
  'service',
  'discovery',
  'latency',
  'floods',
  'exporter',
  'statsfd',
  'restart',
  'crash',
  'guestdir',
  'guestdir-writer',
  'guest-energy',
];
/** Run only when named: a soak of minutes. */
const named = ['guest-energy-soak'];
const wanted = process.argv.slice(2);
const unknown = wanted.filter((w) => !all.includes(w) && !named.includes(w));
if (unknown.length) {
  console.error(`unknown benchmark ${unknown.join(', ')}; choose from ${[...all, ...named].join(', ')}`);
  process.exit(2);
}

// The suites time and weigh the serving process, so they start it without the keeper (the default
// outside systemd); `crash` asks for the keeper with --keeper, which wins over this.
const env = { ...process.env, [NO_KEEPER_ENV]: '1' };
for (const suite of wanted.length ? wanted : all) {
  const url = new URL(`./${suite}.js`, import.meta.url).href;
  const script = `const m = await import(${JSON.stringify(url)}); if (typeof m.run === 'function') await m.run();`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { stdio: 'inherit', env });
  if (r.status !== 0) console.log(`\n== ${suite}: could not run here (exit ${r.status ?? r.signal}); see its output above`);
}
