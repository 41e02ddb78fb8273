/** The one message grammar (src/common/errors.ts): "cannot <what>: <why>; <fix>". */
import { expect, test } from 'vitest';
import { cannot, cannotError } from '../../src/common/errors.js';

test('cannot() writes what, why and the fix in that order, and leaves out an empty fix', () => {
  expect(cannot('create pidfile /run/x.pid', 'permission denied', 'run as root or choose another path with -f')).toBe(
    'cannot create pidfile /run/x.pid: permission denied; run as root or choose another path with -f',
  );
  expect(cannot('listen on /run/s', 'EINVAL')).toBe('cannot listen on /run/s: EINVAL');
  expect(cannot('listen on /run/s', 'EINVAL', '')).toBe('cannot listen on /run/s: EINVAL');
  expect(cannotError('a', 'b', 'c')).toEqual(new Error('cannot a: b; c'));
});
