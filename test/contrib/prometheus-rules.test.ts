/**
 * The shipped Prometheus files under promtool (Debian's prometheus package): every rule file passes
 * `promtool check rules`, the unit tests in contrib/prometheus/tests pass `promtool test rules`,
 * every recording and alerting rule has a unit test, and every example configuration passes
 * `promtool check config` (which also checks the rule files it loads).
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { tempDir } from '../daemon/support/daemon-process.js';
import { missing } from '../support/env.js';
import { PROMETHEUS_DIR, exampleConfigs, ruleFiles, ruleTestFiles, rulesIn } from './support/contrib-files.js';

const noPromtool = () => missing({ command: 'promtool' });
const SKIP = 'promtool not installed (apt-get install prometheus; .ci/run does)';

/** promtool's exit status and its whole output. */
function promtool(args: string[], cwd = PROMETHEUS_DIR): { status: number | null; out: string } {
  const r = spawnSync('promtool', args, { cwd, encoding: 'utf8', timeout: 60_000 });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

describe('shipped Prometheus rules and configurations', () => {
  test('promtool check rules accepts every rule file, each with rules in it', (ctx) => {
    if (noPromtool()) return ctx.skip(SKIP);
    const files = ruleFiles();
    expect(files.map((f) => path.basename(f))).toEqual(['vmsr-alerts.rules.yml', 'vmsr-kepler.rules.yml', 'vmsr-recording.rules.yml']);
    for (const f of files) {
      const r = promtool(['check', 'rules', f]);
      expect(r.out, f).toContain(`SUCCESS: ${rulesIn(f).length} rules found`);
      expect(r.status, r.out).toBe(0);
    }
  });

  test('promtool test rules passes every unit test file with fixture series', (ctx) => {
    if (noPromtool()) return ctx.skip(SKIP);
    const files = ruleTestFiles();
    expect(files.length).toBeGreaterThanOrEqual(3);
    for (const f of files) {
      const r = promtool(['test', 'rules', f], path.dirname(f));
      expect(r.status, r.out).toBe(0);
      expect(r.out).toContain('SUCCESS');
    }
  });

  test('promtool test rules fails when a unit test expects another value than the rule gives', (ctx) => {
    if (noPromtool()) return ctx.skip(SKIP);
    // The runner above would pass nothing if promtool passed everything: one expectation off by 1 W must fail.
    const f = ruleTestFiles().find((x) => x.endsWith('vmsr-recording.test.yml'))!;
    const text = fs.readFileSync(f, 'utf8');
    const wrong = text.replace(/(instance:vmsr_host_package_energy_joules:rate1m\{[^\n]*\n\s*value: )40/, '$141');
    expect(wrong).not.toBe(text);
    const dir = tempDir('vmsr-promtool-');
    try {
      const copy = path.join(dir, 'wrong.test.yml');
      fs.writeFileSync(copy, wrong.replace(/\.\.\/(vmsr-[\w.-]+\.rules\.yml)/g, path.join(PROMETHEUS_DIR, '$1')));
      const r = promtool(['test', 'rules', copy], dir);
      expect(r.status).not.toBe(0);
      expect(r.out).toContain('FAILED');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('every recording and alerting rule is exercised by a unit test', () => {
    const tests = ruleTestFiles().map((f) => fs.readFileSync(f, 'utf8'));
    const rules = ruleFiles().flatMap(rulesIn);
    expect(rules.filter((r) => r.kind === 'alert').length).toBeGreaterThanOrEqual(6);
    for (const r of rules) {
      const tested =
        r.kind === 'alert'
          ? tests.some((t) => new RegExp(`alertname: ${r.name}\\n\\s*exp_alerts:\\n\\s*- exp_labels:`).test(t))
          : tests.some((t) => new RegExp(`- expr: ${r.name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}[\\s{]`).test(t));
      expect(tested, `${r.kind} ${r.name} has no unit test that ${r.kind === 'alert' ? 'expects it to fire' : 'evaluates it'}`).toBe(true);
    }
  });

  test('promtool check config accepts every example configuration and the rule files it loads', (ctx) => {
    if (noPromtool()) return ctx.skip(SKIP);
    const files = exampleConfigs();
    expect(files.map((f) => path.basename(f))).toEqual(['vmsr-kepler-relabel.example.yml', 'vmsr-prometheus.example.yml']);
    for (const f of files) {
      const r = promtool(['check', 'config', f]);
      expect(r.status, r.out).toBe(0);
      expect(r.out).toContain('is valid prometheus config file syntax');
    }
    expect(promtool(['check', 'config', 'vmsr-prometheus.example.yml']).out).toContain('SUCCESS: 3 rule files found');
  });
});
