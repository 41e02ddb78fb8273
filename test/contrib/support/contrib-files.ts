/**
 * The shipped Prometheus and Grafana files (contrib/prometheus, contrib/grafana) as tests read them:
 * where they are, which rules each rule file defines, and the example configuration made to scrape
 * a test's exporter.
 */
import fs from 'node:fs';
import path from 'node:path';
import { ROOT } from '../../daemon/support/daemon-process.js';

export const PROMETHEUS_DIR = path.join(ROOT, 'contrib/prometheus');
export const PROMETHEUS_TESTS_DIR = path.join(PROMETHEUS_DIR, 'tests');
export const DASHBOARD = path.join(ROOT, 'contrib/grafana/vmsr-helper.dashboard.json');

/** The target every shipped example configuration scrapes: the exporter's default address. */
export const EXAMPLE_TARGET = "'127.0.0.1:8677'";

const inDir = (dir: string, suffix: string) =>
  fs
    .readdirSync(dir)
    .filter((f) => f.endsWith(suffix))
    .sort()
    .map((f) => path.join(dir, f));

export const ruleFiles = () => inDir(PROMETHEUS_DIR, '.rules.yml');
export const ruleTestFiles = () => inDir(PROMETHEUS_TESTS_DIR, '.test.yml');
export const exampleConfigs = () => inDir(PROMETHEUS_DIR, '.example.yml');

/** The `- record: NAME` and `- alert: NAME` entries of a rule file, in order. */
export function rulesIn(file: string): { kind: 'record' | 'alert'; name: string }[] {
  return [...fs.readFileSync(file, 'utf8').matchAll(/^\s*- (record|alert): (\S+)\s*$/gm)].map((m) => ({
    kind: m[1] as 'record' | 'alert',
    name: m[2]!,
  }));
}

/** Replaces `from` in `text`, which must occur exactly once (so a changed shipped file fails the test, not silently passes). */
function replaceOnce(text: string, from: string | RegExp, to: string, what: string): string {
  const n = typeof from === 'string' ? text.split(from).length - 1 : [...text.matchAll(new RegExp(from.source, `${from.flags}g`))].length;
  if (n !== 1)
    throw new Error(`cannot adapt ${what}: expected one ${String(from)}, found ${n}; update test/contrib/support/contrib-files.ts`);
  return text.replace(from, to);
}

/**
 * An example configuration as shipped, made to run in a test: it scrapes `target` (or each of them) instead of the
 * default address, every second (the shipped 15 s would make a test wait minutes), and its rule
 * files are named by absolute path (the copy runs from a temporary directory): the shipped ones, or
 * their copies in `ruleDir` (ruleFilesHeldFor).
 */
export function adaptedExample(file: string, target: string | readonly string[], ruleDir = PROMETHEUS_DIR): string {
  let text = fs.readFileSync(file, 'utf8');
  const targets = typeof target === 'string' ? [target] : target;
  text = replaceOnce(text, EXAMPLE_TARGET, targets.map((t) => `'${t}'`).join(', '), file);
  text = replaceOnce(text, /^ {2}scrape_interval: 15s$/m, '  scrape_interval: 1s', file);
  if (/^ {2}evaluation_interval: 15s$/m.test(text))
    text = replaceOnce(text, /^ {2}evaluation_interval: 15s$/m, '  evaluation_interval: 1s', file);
  return text.replace(/^(\s*- )(vmsr-[\w.-]+\.rules\.yml)$/gm, (_, lead: string, name: string) => `${lead}${path.join(ruleDir, name)}`);
}

/**
 * Copies of the shipped rule files in `dir` whose every `for:` is `hold` (e.g. '5s'), so that a test
 * sees an alert fire within its time; nothing else differs from the shipped file (checked: the
 * expressions, labels and annotations stay the shipped ones). Returns the copies' paths, in the
 * order of ruleFiles().
 */
export function ruleFilesHeldFor(dir: string, hold: string): string[] {
  return ruleFiles().map((file) => {
    const shipped = fs.readFileSync(file, 'utf8');
    const copy = shipped.replace(/^(\s+for: )\d+[smh]$/gm, `$1${hold}`);
    const a = shipped.split('\n');
    const b = copy.split('\n');
    const changed = a.filter((line, i) => line !== b[i]);
    if (a.length !== b.length || changed.some((line) => !/^\s+for: /.test(line)))
      throw new Error(`cannot hold ${file} for ${hold}: lines other than for: changed`);
    const out = path.join(dir, path.basename(file));
    fs.writeFileSync(out, copy);
    return out;
  });
}
