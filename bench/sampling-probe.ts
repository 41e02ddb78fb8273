/**
 * Our side of the sampling floor, run as its own process with the daemon's Node flags, in process CPU
 * time per thread per round:
 *   node sampling-probe.js ROUNDS PID...  ->  threads=N ns_per_thread=X   (as bench/native/stat-floor.c)
 * Default: what the daemon does each interval, ProcTaskReader with its gates feeding a RatioEngine
 * with every pid registered (its threads as vCPUs). --every-line: every thread's stat read and parsed
 * each round (gates off), what threads that ran since the last interval cost.
 */
import os from 'node:os';
import { ProcTaskReader } from '../src/os/proc-tasks.js';
import { RatioEngine } from '../src/ratio/attribution.js';
import { parseStatLine } from '../src/ratio/stat.js';

const args = process.argv.slice(2);
const everyLine = args.includes('--every-line');
const [roundsText, ...pidTexts] = args.filter((a) => a !== '--every-line');
const rounds = Number(roundsText);
const pids = pidTexts.map(Number);
const reader = new ProcTaskReader('/proc', { relistEvery: 1_000_000, gate: !everyLine });
const engine = new RatioEngine({
  vendor: 'intel',
  clkTck: 100,
  cpus: os.cpus().map((_, cpu) => ({ cpu, pkg: 0 })),
  packages: [{ pkg: 0, powerUnit: 0xa0e03n }],
});
let threads = 0;
for (const pid of pids) {
  const lines = reader.read(pid); // opens the fds (not measured)
  if (lines === null) continue;
  threads += lines.size;
  const main = parseStatLine(lines.get(pid) ?? '');
  if (!main.ok) continue;
  const vcpus = [...lines.keys()].filter((t) => t !== pid).map((tid) => ({ tid, vpkg: 0 }));
  if (!everyLine && vcpus.length > 0) engine.register({ pid, starttime: main.value.starttime, vcpus });
}
let sink = 0;
let tNs = 1_000_000_000n;
let energy = 0n;
const t0 = process.cpuUsage();
for (let r = 0; r < rounds; r++) {
  if (everyLine) {
    for (const pid of pids) {
      const lines = reader.read(pid);
      if (lines === null) continue;
      for (const line of lines.values()) {
        const st = parseStatLine(line);
        if (st.ok) sink += st.value.utime + st.value.stime + st.value.starttime + st.value.processor;
      }
    }
  } else {
    const tasks = new Map<number, Map<number, string>>();
    for (const pid of pids) {
      const lines = reader.read(pid);
      if (lines !== null) tasks.set(pid, lines);
    }
    tNs += 1_000_000_000n;
    energy = (energy + 16384n) & 0xffffffffn;
    sink += engine.addSample({ tNs, energy: new Map([[0, energy]]), tasks })?.vms.length ?? 0;
  }
}
const d = process.cpuUsage(t0);
console.log(`threads=${threads} ns_per_thread=${(((d.user + d.system) * 1000) / rounds / threads).toFixed(1)} sink=${sink > 0 ? 1 : 0}`);
reader.close();
