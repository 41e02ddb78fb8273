import { describe, expect, test } from 'vitest';
import { parseYamlSubset } from '../../src/exporter/yaml-subset.js';

const parse = (text: string): unknown => JSON.parse(JSON.stringify(parseYamlSubset(text, 'web.yml')));

describe('the YAML subset of web configuration files', () => {
  test('nested mappings, comments, quoted and plain scalars, lists and --- read as YAML does', () => {
    const text = [
      '---',
      '# a comment',
      'tls_server_config:',
      '  cert_file: "/etc/vmsr/server.crt"   # trailing comment',
      "  key_file: '/etc/vmsr/it''s.key'",
      '  min_version: TLS12',
      '  prefer_server_cipher_suites: false',
      '  cipher_suites:',
      '    - TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256',
      '    - "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"',
      '  curve_preferences: [X25519, "CurveP256"]',
      '  client_allowed_sans:',
      '  - prometheus.example',
      '',
      'basic_auth_users:',
      '  alice: $2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze',
      '  "bob smith": x#not-a-comment',
      'empty:',
      'nothing: ~',
      'number: 42',
      'flow_empty: {}',
      'list_empty: []',
      'escaped: "tab\\there \\u00e9"',
    ].join('\n');
    expect(parse(text)).toEqual({
      tls_server_config: {
        cert_file: '/etc/vmsr/server.crt',
        key_file: "/etc/vmsr/it's.key",
        min_version: 'TLS12',
        prefer_server_cipher_suites: false,
        cipher_suites: ['TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256', 'TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384'],
        curve_preferences: ['X25519', 'CurveP256'],
        client_allowed_sans: ['prometheus.example'],
      },
      basic_auth_users: { alice: '$2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze', 'bob smith': 'x#not-a-comment' },
      empty: null,
      nothing: null,
      number: 42,
      flow_empty: {},
      list_empty: [],
      escaped: 'tab\there é',
    });
  });

  test('a literal block scalar keeps inline PEM text as written', () => {
    const pem = '-----BEGIN CERTIFICATE-----\nMIIB # not a comment\n-----END CERTIFICATE-----';
    const text = `tls_server_config:\n  cert: |\n${pem
      .split('\n')
      .map((l) => `    ${l}`)
      .join('\n')}\n  key_file: k.pem\n`;
    expect(parse(text)).toEqual({ tls_server_config: { cert: `${pem}\n`, key_file: 'k.pem' } });
    expect(parse('a: |-\n  x\n  y\n')).toEqual({ a: 'x\ny' });
  });

  test('an empty file or a lone --- is an empty document', () => {
    expect(parse('')).toBeNull();
    expect(parse('---\n# nothing\n')).toBeNull();
  });

  test('what the subset does not take is refused with its line number and a fix', () => {
    const cases: [string, RegExp][] = [
      ['a: 1\na: 2', /line 2: the key "a" appears twice; keep one/],
      ['a:\n\tb: 1', /line 2: a tab in the indentation; indent with spaces/],
      ['a: &x 1', /line 1: "&" starts an anchor, alias, tag or block/],
      ['a: *x', /line 1: "\*" starts an anchor/],
      ['a: !!str 1', /line 1: "!" starts/],
      ['a: >\n  folded', /line 1: ">" starts/],
      ['a: b: c', /line 1: "b: c": a colon and a blank inside a plain value; quote the value/],
      ['a: "open', /line 1: a double-quoted string does not end on its line/],
      ['a: "x" y', /line 1: "y" after a quoted string/],
      ['a: [x, [y]]', /line 1: an empty or nested item in a flow sequence/],
      ['a: [x, y', /line 1: a flow sequence that does not end with \]/],
      ['a: {b: 1}', /line 1: a flow mapping/],
      ['a:\n  - b: 1', /line 2: a mapping inside a sequence/],
      ['a: 1\n  b: 2', /line 2: unexpected indentation/],
      ['a:\n    b: 1\n  c: 2', /line 3: unexpected indentation/],
      ['  a: 1', /line 1: the first entry is indented/],
      ['a: 1\n---\nb: 2', /line 2: a second document/],
      ['just text', /line 1: "just text" is not "key: value"/],
      ['a: "\\q"', /line 1: unknown escape \\q/],
      ['a: |\nb: 1', /line 1: an empty block scalar/],
    ];
    for (const [text, why] of cases) {
      expect(() => parseYamlSubset(text, 'web.yml'), text).toThrow(why);
      expect(() => parseYamlSubset(text, 'web.yml'), text).toThrow(/^cannot read web\.yml: line \d+: /);
    }
  });

  test('a key named __proto__ is data, not a prototype', () => {
    const v = parseYamlSubset('__proto__:\n  polluted: 1\n', 'web.yml') as Record<string, unknown>;
    expect(Object.keys(v)).toEqual(['__proto__']);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });
});
