/** A state snapshot in a real sealed memfd: written, sealed, read back; any other fd is refused. */
import fs from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { closeFd } from '../../src/os/libc/fds.js';
import { addSeals, F_SEAL_GROW, F_SEAL_SHRINK, getSeals, memfdCreate } from '../../src/os/libc/memfd-mmap.js';
import { recvWithFds, sendFds, socketpair } from '../../src/os/libc/sockets.js';
import { decodeState, encodeState } from '../../src/state/snapshot-codec.js';
import { readStateBytes, STATE_SEALS, writeStateMemfd } from '../../src/state/memfd.js';
import type { StateSnapshot } from '../../src/state/snapshot.js';

const STATE: StateSnapshot = {
  nextHostVmId: 2,
  vms: [
    {
      hostVmId: 1,
      pid: 1234,
      starttime: 99,
      uid: 107,
      owner: 3,
      discovered: false,
      name: 'vm',
      uuid: null,
      wholeVmOnly: false,
      live: true,
      baseline: false,
      valuesNs: 0n,
      endedSamples: 0,
      vcpus: [{ tid: 1235, vpkg: 0 }],
      vpkgs: [{ energyJ: 0.000005, energyUj: 5n, counter: 1n }],
    },
  ],
  packages: [{ pkg: 0, energyJ: 0.000009, unattributedJ: 0.000004, energyUj: 9n, unattributedUj: 4n }],
  knownPids: [],
  lastSample: null,
};

const opened: number[] = [];
afterEach(() => {
  for (const fd of opened.splice(0)) closeFd(fd);
});

describe('state in a sealed memfd', () => {
  it('writeStateMemfd seals what it wrote, and readStateBytes reads it back, also after passing the fd over a socket', () => {
    const fd = writeStateMemfd(STATE);
    opened.push(fd);
    expect(getSeals(fd) & STATE_SEALS).toBe(STATE_SEALS);
    expect(() => fs.writeSync(fd, 'x', 0)).toThrow(/EPERM/);
    expect(decodeState(readStateBytes(fd))).toEqual({ ok: true, value: STATE });
    const [a, b] = socketpair();
    opened.push(a, b);
    sendFds(a, Buffer.from('s'), [fd]);
    const got = recvWithFds(b, 1, 1);
    opened.push(...got.fds);
    expect(decodeState(readStateBytes(got.fds[0]!))).toEqual({ ok: true, value: STATE });
  });

  it('refuses an fd that is not a memfd, and a memfd that could still be written', () => {
    const file = fs.openSync('/proc/self/stat', 'r');
    opened.push(file);
    expect(() => readStateBytes(file)).toThrow(
      /^cannot restore state: fd \d+ is not a memfd \(fcntl\(\d+, F_GET_SEALS\): EINVAL\); start without/,
    );
    const open = memfdCreate('open-state');
    opened.push(open);
    fs.writeSync(open, encodeState(STATE), 0, undefined, 0);
    addSeals(open, F_SEAL_GROW | F_SEAL_SHRINK);
    expect(() => readStateBytes(open)).toThrow(/the memfd has seals 0x6, not all of 0xf: it could still be changed/);
  });

  it('refuses a sealed memfd whose bytes are not a snapshot', () => {
    const fd = memfdCreate('junk');
    opened.push(fd);
    fs.writeSync(fd, 'not a snapshot at all, just text', 0);
    addSeals(fd, STATE_SEALS);
    expect(decodeState(readStateBytes(fd))).toMatchObject({
      ok: false,
      error: expect.stringMatching(/^cannot restore state: it does not start with VMSRSTAT/),
    });
  });
});
