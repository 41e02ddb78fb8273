/**
 * The suite's neighbours: what a shared host runs beside the tests. 10 QEMU-like processes of other
 * users (uids 2001..2010, each a fake VM of 2 vCPU threads named as QEMU names them, from
 * test/support/fake-qemu.ts) and 2 busy loops. Every neighbour dies with this process, SIGKILL
 * included (the VMs when their farm's pipe closes, the loops by PR_SET_PDEATHSIG), so nothing is left behind.
 *
 *   node dist/bench/busy-host.js                 # until Ctrl-C / SIGTERM
 *   node dist/bench/busy-host.js -- npx vitest run test/discovery/observers.test.ts
 *   node dist/bench/busy-host.js --loops 5 -- ...  # a busier host: 5 loops
 *
 * With a command: starts the neighbours, runs it, stops them and exits with its code. Needs root (other uids).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { FakeQemuFarm, PYTHON } from '../test/support/fake-qemu.js';

const FIRST_UID = 2001;
const VMS = 10;
/** Busy loops by default; --loops N for more. */
const LOOPS = 2;

/** A busy loop that the kernel kills when its parent (this process) dies. */
const LOOP = 'import ctypes; ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\nwhile True: pass';

async function start(nLoops: number): Promise<{ farms: FakeQemuFarm[]; loops: ChildProcess[] }> {
  const farms: FakeQemuFarm[] = [];
  for (let i = 0; i < VMS; i++) {
    const uid = FIRST_UID + i;
    farms.push(new FakeQemuFarm(1, 2, { uid, args: ['-name', `guest=neighbour-${uid}`, '-smp', '2'], wakeEveryMs: 100 }));
  }
  const loops = Array.from({ length: nLoops }, () => spawn(PYTHON, ['-c', LOOP], { stdio: 'ignore' }));
  const pids = (await Promise.all(farms.map((f) => f.ready()))).flat();
  console.log(`busy-host: ${VMS} QEMU-like processes of uids ${FIRST_UID}..${FIRST_UID + VMS - 1} (pids ${pids.join(' ')}),`);
  console.log(`busy-host: ${nLoops} busy loops (pids ${loops.map((l) => l.pid).join(' ')})`);
  return { farms, loops };
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) {
    console.error('cannot start the neighbours: other uids need root; run it as root');
    process.exit(2);
  }
  const sep = process.argv.indexOf('--');
  const command = sep >= 0 ? process.argv.slice(sep + 1) : [];
  const own = sep >= 0 ? process.argv.slice(2, sep) : process.argv.slice(2);
  const nLoops = own[0] === '--loops' ? Number(own[1]) : LOOPS;
  if (!Number.isSafeInteger(nLoops) || nLoops < 0 || nLoops > 64 || (own.length && own[0] !== '--loops')) {
    console.error(`cannot start the neighbours: usage: busy-host [--loops N (0..64)] [-- command ...]; got ${own.join(' ')}`);
    process.exit(2);
  }
  const { farms, loops } = await start(nLoops);
  const stop = async (code: number): Promise<never> => {
    for (const l of loops) l.kill('SIGKILL');
    await Promise.all(farms.map((f) => f.kill()));
    console.log('busy-host: neighbours stopped');
    process.exit(code);
  };
  process.on('SIGINT', () => void stop(130));
  process.on('SIGTERM', () => void stop(143));
  if (!command.length) return;
  const child = spawn(command[0]!, command.slice(1), { stdio: 'inherit' });
  child.on('exit', (code, signal) => void stop(code ?? (signal ? 1 : 0)));
}

await main();
