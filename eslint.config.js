// ESLint for src/, test/ and bench/: typescript-eslint's recommended rules plus the few house rules that
// keep one spelling of a thing (type-only imports, one import per module, === only). Formatting is
// Prettier's (.prettierrc.json), not ESLint's. Both run in `npm test` (the `lint` script), with the
// function-length rule below.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'node_modules/', 'test/fixtures/', 'traces/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['**/*.ts'],
    rules: {
      '@typescript-eslint/consistent-type-imports': ['error', { prefer: 'type-imports', fixStyle: 'inline-type-imports' }],
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
      'no-duplicate-imports': 'error',
      eqeqeq: ['error', 'always', { null: 'ignore' }],
      'prefer-const': 'error',
      // `ok && next()` and `c ? a() : b()` as statements are the house's short forms.
      '@typescript-eslint/no-unused-expressions': ['error', { allowShortCircuit: true, allowTernary: true }],
      // Control characters are matched on purpose: hostile names and stat lines are escaped or refused by them.
      'no-control-regex': 'off',
      'no-var': 'error',
    },
  },
  {
    // Functions stay short: at most 80 code lines, comments and blank lines not counted. A nested
    // closure counts inside the function that holds it (the rule measures a function from its first
    // line to its last), so a long body cannot hide in an inner arrow. src/ and bench/ (a
    // benchmark's run() too: a long one is split into a function per phase); not test/: a test
    // file's describe() callback is a list of cases, not a function one reads as a unit.
    files: ['src/**/*.ts', 'bench/**/*.ts'],
    rules: {
      'max-lines-per-function': ['error', { max: 80, skipComments: true, skipBlankLines: true, IIFEs: true }],
    },
  },
);
