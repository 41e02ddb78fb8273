/** --energy-source: one option, its choices auto and the one list of source kinds. */
import { Command } from 'commander';
import { describe, expect, test } from 'vitest';
import { energySourceOption } from '../../src/cli/options.js';
import { DEFAULT_ENERGY_SOURCE, ENERGY_SOURCE_CHOICES, ENERGY_SOURCE_KINDS } from '../../src/energy/kinds.js';

const parse = (args: string[]) => {
  const cmd = new Command()
    .exitOverride()
    .configureOutput({ writeErr: () => {} })
    .addOption(energySourceOption());
  cmd.parse(args, { from: 'user' });
  return cmd.opts().energySource as unknown;
};

describe('--energy-source', () => {
  test('offers auto and exactly the source kinds, auto by default', () => {
    expect(energySourceOption().argChoices).toEqual(['auto', ...ENERGY_SOURCE_KINDS]);
    expect(ENERGY_SOURCE_CHOICES).toEqual(['auto', 'msr', 'powercap', 'synthetic']);
    expect(parse([])).toBe(DEFAULT_ENERGY_SOURCE);
    expect(DEFAULT_ENERGY_SOURCE).toBe('auto');
    for (const kind of ENERGY_SOURCE_KINDS) expect(parse(['--energy-source', kind])).toBe(kind);
  });

  test('refuses a name that is not a source kind', () => {
    expect(() => parse(['--energy-source', 'powercap-typo'])).toThrow(/Allowed choices are auto, msr, powercap, synthetic/);
  });
});
