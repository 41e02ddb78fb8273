import { describe, expect, test } from 'vitest';
import { formatListenAddress, parseListenAddress } from '../../src/exporter/listen-address.js';

describe('--listen', () => {
  test('--listen takes HOST:PORT, [IPv6]:PORT, host names and :PORT as Go exporters do', () => {
    expect(parseListenAddress('127.0.0.1:8677')).toEqual({ host: '127.0.0.1', port: 8677 });
    expect(parseListenAddress('[::1]:9')).toEqual({ host: '::1', port: 9 });
    expect(parseListenAddress('[::]:9')).toEqual({ host: '::', port: 9 });
    expect(parseListenAddress('[fe80::1%eth0]:9')).toEqual({ host: 'fe80::1%eth0', port: 9 });
    expect(parseListenAddress('localhost:0')).toEqual({ host: 'localhost', port: 0 });
    expect(parseListenAddress('hv-17.example.org:8677')).toEqual({ host: 'hv-17.example.org', port: 8677 });
    expect(parseListenAddress('0.0.0.0:8677')).toEqual({ host: '0.0.0.0', port: 8677 });
    expect(parseListenAddress(':8677')).toEqual({ host: null, port: 8677 });
  });

  test('--listen refuses what is not [HOST]:PORT, naming why and the fix', () => {
    const cases: [string, RegExp][] = [
      ['8677', /no :PORT/],
      ['::1:8677', /IPv6 address needs brackets/],
      ['[::1]8677', /not a number|bracketed/],
      ['[zz]:1', /not a bracketed IPv6 address/],
      ['h:99999', /over 65535/],
      ['h:', /not a number/],
      ['a b:1', /neither an address nor a host name/],
      ['-h:1', /neither an address nor a host name/],
      ['', /no :PORT/],
    ];
    for (const [bad, why] of cases) {
      expect(() => parseListenAddress(bad)).toThrow(why);
      expect(() => parseListenAddress(bad)).toThrow(/cannot use --listen .*; use \[HOST\]:PORT, e\.g\./);
    }
  });

  test('an address prints back as --listen takes it', () => {
    for (const text of ['127.0.0.1:8677', '[::1]:9', ':8677', 'localhost:1'])
      expect(formatListenAddress(parseListenAddress(text))).toBe(text);
  });
});
