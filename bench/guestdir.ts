/**
 * What --guest-dir costs the daemon (goal: at most 10 % more CPU per sampling interval with 500 VMs).
 *
 * Real daemons (the built entry, discovery off) side by side on one fake host (its package, core, DRAM
 * and PSYS counters counting), each with the same 500 stand-in VMs registered over v2 (C processes,
 * bench/native/idle-threads.c, of 8 threads that wake 4 times a second as an idle guest's timer does;
 * they take too little CPU to be given energy, so their energy_uj files stay 0 and are not written
 * again: idle VMs). A VM is given energy for an interval only when its threads' CPU time, counted in
 * clock ticks of 10 ms, moved: 500 VMs doing so every 0.5 s would take 10 cores, which this machine
 * has not. So the busy case (every zone of every VM changed at every interval) adds to the publishing
 * daemons' CPU what writing those files costs the publisher (guestdir-writer.ts, the same code in
 * this process, every zone changing less none changing), measured right after.
 * Half publish, each into its own guest directory on tmpfs (/dev/shm, as /run is on a host) holding
 * one DIR/<name>/ per VM, the others are started with --no-guest-dir. Their CPU (every thread, from
 * /proc/<pid>/task/N/schedstat) is read over the same windows after a warm-up (V8 optimises an
 * interval's code only after many runs), with every domain and with --domains package (one zone a VM).
 * Prints the ratio; never fails on timing.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { V2Client } from '../src/client/v2-client.js';
import { MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS, MSR_PP0_ENERGY_STATUS } from '../src/msr/registers.js';
import { FakeHost } from '../test/support/fake-host.js';
import { printTable, spreadText } from './stats.js';
import { buildTools, cpuSeconds, HELPER_BIN, waitConnectable } from './tools.js';
import { writerCost } from './guestdir-writer.js';

const VMS = 500;
const VCPUS = 8;
const INTERVAL_S = 0.5;
const WARMUP_S = 20;
const WINDOW_S = 6;
const WINDOWS = 4;
/** Daemons of each kind: V8's optimising differs between processes and moves one daemon's figure. */
const PAIRS = 2;
const DOMAIN_MSRS = [MSR_PP0_ENERGY_STATUS, MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS];

/** `n` stand-in VMs named bench-gd-<k> on their command line (their guest directories' names). */
async function startVms(tool: string, n: number): Promise<ChildProcess[]> {
  const kids: ChildProcess[] = [];
  for (let k = 0; k < n; k++) {
    const c = spawn(tool, [String(VCPUS), '250', '-name', `guest=bench-gd-${k}`], {
      argv0: 'qemu-system-x86_64',
      stdio: ['pipe', 'pipe', 'ignore'],
    });
    kids.push(c);
    await new Promise<void>((resolve, reject) => {
      c.stdout!.once('data', () => resolve());
      c.once('exit', () => reject(new Error('idle-threads exited')));
    });
  }
  return kids;
}

const threadsOf = (pid: number) =>
  fs
    .readdirSync(`/proc/${pid}/task`)
    .map(Number)
    .filter((t) => t !== pid)
    .map((tid) => ({ tid, vpkg: 0 }));

/** µs of CPU per interval of each kind (publishing or not), per window. */
async function windows(h: FakeHost, kids: ChildProcess[], guests: string, domains: boolean): Promise<{ on: number[]; off: number[] }> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-bench-guestdir-'));
  const kinds = [...Array<boolean>(PAIRS).fill(true), ...Array<boolean>(PAIRS).fill(false)];
  const daemons: ChildProcess[] = [];
  const clients: V2Client[] = [];
  try {
    for (const [i, on] of kinds.entries()) {
      const socket = path.join(dir, `${i}.sock`);
      const args = [HELPER_BIN, '-k', socket, '--sys-root', h.sysRoot, '--msr-path', h.msrPathTemplate, '--vendor', 'intel', '-q'];
      args.push('--no-discovery', '--interval', String(INTERVAL_S), '--max-vms', String(VMS * 2), '--max-vms-per-connection', String(VMS));
      args.push(...(on ? ['--guest-dir', path.join(guests, String(i))] : ['--no-guest-dir']), ...(domains ? [] : ['--domains', 'package']));
      daemons.push(spawn(process.execPath, args, { stdio: ['ignore', 'ignore', 'inherit'] }));
      await waitConnectable(socket, Date.now() + 60_000);
      const c = await V2Client.connect(socket);
      clients.push(c);
      for (const k of kids) await c.register({ pid: k.pid!, vcpus: threadsOf(k.pid!) });
    }
    await sleep(WARMUP_S * 1000);
    const on: number[] = [];
    const off: number[] = [];
    for (let w = 0; w < WINDOWS; w++) {
      const before = daemons.map((d) => cpuSeconds(d.pid!));
      const t0 = performance.now();
      await sleep(WINDOW_S * 1000);
      const intervals = (performance.now() - t0) / 1000 / INTERVAL_S;
      const mean = (kind: boolean) =>
        daemons.reduce((s, d, i) => (kinds[i] === kind ? s + ((cpuSeconds(d.pid!) - before[i]!) * 1e6) / intervals : s), 0) / PAIRS;
      on.push(mean(true));
      off.push(mean(false));
    }
    return { on, off };
  } finally {
    for (const c of clients) await c.close().catch(() => {});
    for (const d of daemons) {
      d.kill('SIGTERM');
      if (d.exitCode === null && d.signalCode === null) await new Promise((r) => d.once('exit', r));
    }
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

export async function run(): Promise<void> {
  console.log(
    `\n== guestdir: the daemon's CPU per ${INTERVAL_S * 1000} ms interval with ${VMS} VMs of ${VCPUS} vCPUs, publishing into guest directories or not`,
  );
  const tools = buildTools();
  if ('unavailable' in tools) {
    console.log(`cannot run: ${tools.unavailable}`);
    return;
  }
  const shm = fs.existsSync('/dev/shm') ? '/dev/shm' : os.tmpdir();
  const guests = fs.mkdtempSync(path.join(shm, 'vmsr-bench-guests-'));
  const h = new FakeHost({ packages: os.cpus().map(() => 0) });
  h.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 1000 } });
  for (const msr of DOMAIN_MSRS) h.setCounter(h.cpusOf(0).slice(0, 1), msr, 1000);
  const pump = setInterval(() => {
    h.addEnergy(0, 5000);
    for (const msr of DOMAIN_MSRS) h.addCounter(h.cpusOf(0).slice(0, 1), msr, 1500);
  }, 20);
  let kids: ChildProcess[] = [];
  try {
    kids = await startVms(tools['idle-threads'], VMS);
    // One DIR per publishing daemon, a directory per VM in each.
    for (let i = 0; i < PAIRS; i++)
      for (let k = 0; k < VMS; k++) fs.mkdirSync(path.join(guests, String(i), `bench-gd-${k}`), { recursive: true });
    const rows = [
      ['domains', 'VMs', 'no guest dir, us/interval', 'guest dirs, us/interval', 'ratio (goal <= 1.10)', 'energy_uj written / interval'],
    ];
    for (const domains of [true, false]) {
      const { on, off } = await windows(h, kids, guests, domains);
      const mean = (xs: number[]) => xs.reduce((s, x) => s + x, 0) / xs.length;
      const what = domains ? 'package, core, dram, psys' : 'package';
      rows.push([what, 'idle', spreadText(off, 0), spreadText(on, 0), (mean(on) / mean(off)).toFixed(2), '0']);
      // The files the busy case writes: the publisher's extra when every zone changes, per interval.
      const files = writerCost(true, domains).total - writerCost(false, domains).total;
      const busy = on.map((x) => x + files);
      rows.push([
        what,
        'busy (+ writer)',
        spreadText(off, 0),
        spreadText(busy, 0),
        (mean(busy) / mean(off)).toFixed(2),
        String(VMS * (domains ? 4 : 1)),
      ]);
    }
    printTable(rows);
  } finally {
    clearInterval(pump);
    for (const k of kids) k.kill('SIGKILL');
    h.cleanup();
    fs.rmSync(guests, { recursive: true, force: true });
    fs.rmSync(tools.dir, { recursive: true, force: true });
  }
}
