/**
 * Our side of the sampling floor, run as its own process with the daemon's Node flags: what the
 * daemon does per thread each interval (pread of every kept stat fd through ProcTaskReader, then the
 * engine's parse of each line), in process CPU time.
 *   node sampling-probe.js ROUNDS PID...  ->  threads=N ns_per_thread=X   (as bench/native/stat-floor.c)
 */
import { ProcTaskReader } from '../src/os/proc-tasks.js';
import { parseStatLine } from '../src/ratio/stat.js';

const [roundsText, ...pidTexts] = process.argv.slice(2);
const rounds = Number(roundsText);
const pids = pidTexts.map(Number);
const reader = new ProcTaskReader('/proc', { relistEvery: 1_000_000 });
let threads = 0;
for (const pid of pids) threads += reader.read(pid)?.size ?? 0; // opens the fds (not measured)
let sink = 0;
const t0 = process.cpuUsage();
for (let r = 0; r < rounds; r++) {
  for (const pid of pids) {
    const lines = reader.read(pid);
    if (lines === null) continue;
    for (const line of lines.values()) {
      const st = parseStatLine(line);
      if (st.ok) sink += st.value.utime + st.value.stime + st.value.starttime + st.value.processor;
    }
  }
}
const d = process.cpuUsage(t0);
console.log(`threads=${threads} ns_per_thread=${(((d.user + d.system) * 1000) / rounds / threads).toFixed(1)} sink=${sink > 0 ? 1 : 0}`);
reader.close();
