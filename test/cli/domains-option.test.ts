/** --domains: one option on the daemon and record, its values the one list of RAPL domains. */
import { Command } from 'commander';
import { describe, expect, test } from 'vitest';
import { addV2Options, domainsOption, v2OptionsFrom, type V2CliOptions } from '../../src/cli/options.js';
import { ENERGY_DOMAINS } from '../../src/energy/energy-source.js';

const parse = (args: string[]): unknown => {
  const cmd = new Command()
    .exitOverride()
    .configureOutput({ writeErr: () => {} })
    .addOption(domainsOption());
  cmd.parse(args, { from: 'user' });
  return cmd.opts().domains;
};

describe('--domains', () => {
  test('takes domains of the one list, in its order, each once, and nothing when not given', () => {
    expect(parse([])).toBeUndefined();
    expect(parse(['--domains', 'psys,dram,package,dram'])).toEqual(['package', 'dram', 'psys']);
    expect(parse(['--domains', ENERGY_DOMAINS.join(',')])).toEqual([...ENERGY_DOMAINS]);
  });

  test('refuses a name that is not a domain, naming the ones there are', () => {
    expect(() => parse(['--domains', 'dram,gpu'])).toThrow(
      /expected RAPL domains separated by commas, among package, core, uncore, dram, psys \(got "dram,gpu"\)/,
    );
    expect(() => parse(['--domains', ''])).toThrow(/expected RAPL domains/);
  });

  test('reaches the daemon v2 settings when given, and stays absent (every domain found) when not', () => {
    const cmd = new Command().exitOverride().configureOutput({ writeErr: () => {} });
    addV2Options(cmd);
    cmd.parse(['--domains', 'core,dram'], { from: 'user' });
    expect(v2OptionsFrom(cmd.opts<V2CliOptions>()).domains).toEqual(['core', 'dram']);
    expect(v2OptionsFrom({}).domains).toBeUndefined();
  });
});
