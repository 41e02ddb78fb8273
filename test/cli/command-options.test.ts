/**
 * commandOptions: a subcommand's own options win over its ancestors' defaults, and an option the user
 * gave before the subcommand still reaches it. End to end: `record --interval 0.1` samples ten times a
 * second (it sampled once a second, the daemon's default interval winning).
 */
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { commandOptions } from '../../src/cli/options.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const BIN = path.join(ROOT, 'dist/src/bin/vmsr-helper.js');

function program(): { root: Command; seen: Record<string, unknown>[] } {
  const seen: Record<string, unknown>[] = [];
  const root = new Command('x').exitOverride().enablePositionalOptions();
  root.option('--interval <s>', '', Number, 1).option('--msr-path <p>', '', String, '/dev/cpu/%u/msr');
  root
    .command('record')
    .exitOverride()
    .option('--interval <s>', '', Number, 1)
    .option('--msr-path <p>', '', String, '/dev/cpu/%u/msr')
    .action((_o: unknown, cmd: Command) => void seen.push(commandOptions(cmd)));
  return { root, seen };
}

describe('commandOptions', () => {
  it("takes the subcommand's given value over an ancestor's default", () => {
    const { root, seen } = program();
    root.parse(['record', '--interval', '0.1'], { from: 'user' });
    expect(seen[0]).toMatchObject({ interval: 0.1, msrPath: '/dev/cpu/%u/msr' });
  });

  it("takes a value given before the subcommand over the subcommand's default", () => {
    const { root, seen } = program();
    root.parse(['--msr-path', '/tmp/m/%u', 'record'], { from: 'user' });
    expect(seen[0]).toMatchObject({ interval: 1, msrPath: '/tmp/m/%u' });
  });

  it('record --interval 0.1 writes about ten samples in one second', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-cmdopts-'));
    const vm = spawn('sleep', ['30']);
    try {
      const out = path.join(dir, 't.jsonl');
      const args = ['record', '--pid', String(vm.pid), '--vcpus', `${vm.pid}:0`, '--interval', '0.1', '--duration', '1'];
      execFileSync(process.execPath, [BIN, ...args, '--energy-source', 'synthetic', '-o', out], { stdio: 'pipe', timeout: 20_000 });
      const samples = fs
        .readFileSync(out, 'utf8')
        .split('\n')
        .filter((l) => l.includes('"type":"sample"')).length;
      expect(samples).toBeGreaterThanOrEqual(8);
      expect(samples).toBeLessThanOrEqual(12);
    } finally {
      vm.kill();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
