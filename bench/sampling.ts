/**
 * Sampling cost: CPU time (process.cpuUsage) per thread per interval for ProcTaskReader with kept fds,
 * over real threads (python3 processes with sleeping threads), with its gates (what the daemon does:
 * sleeping threads are answered without a stat read) and without (every line read, as for threads
 * that ran), and the first-sample (listing) cost.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { raiseFdLimit } from '../src/budget/fd-budget.js';
import { ProcTaskReader } from '../src/os/proc-tasks.js';

const THREADS_PER_PROC = 500;
const SCRIPT = `
import sys, threading
ev = threading.Event()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=ev.wait, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
`;

export async function startProcs(threads: number): Promise<ChildProcess[]> {
  const procs: ChildProcess[] = [];
  for (let left = threads; left > 0; left -= THREADS_PER_PROC) {
    // n sleeping threads plus the main thread
    const n = Math.min(THREADS_PER_PROC, left) - 1;
    const c = spawn('python3', ['-c', SCRIPT, String(Math.max(0, n))], { stdio: ['pipe', 'pipe', 'ignore'] });
    procs.push(c);
    await new Promise<void>((resolve, reject) => {
      c.once('error', reject);
      c.stdout!.once('data', () => resolve());
      c.once('exit', () => reject(new Error('python3 exited early')));
    });
  }
  return procs;
}

function cpuUs(f: () => void): number {
  const a = process.cpuUsage();
  f();
  const d = process.cpuUsage(a);
  return d.user + d.system;
}

export async function run(): Promise<void> {
  console.log('\n== sampling: ProcTaskReader CPU cost (kept stat fds, pread at 0)');
  raiseFdLimit(); // as the daemon does: 8,000 threads keep 16,000 fds with the gates, 8,000 without (one reader at a time)
  console.log('threads   procs   first sample (list+open) us/thread   steady us/thread, gates / every line read   fds');
  for (const threads of [100, 1000, 8000]) {
    let procs: ChildProcess[] = [];
    try {
      procs = await startProcs(threads);
      const pids = procs.map((p) => p.pid!);
      const r = new ProcTaskReader('/proc', { relistEvery: 1_000_000 });
      let seen = 0;
      const first = cpuUs(() => {
        for (const pid of pids) seen += r.read(pid)?.size ?? 0;
      });
      const rounds = threads >= 8000 ? 5 : 20;
      const steady = (reader: ProcTaskReader) =>
        cpuUs(() => {
          for (let i = 0; i < rounds; i++) for (const pid of pids) reader.read(pid);
        }) /
        rounds /
        seen;
      const gated = steady(r);
      const fds = r.openFds;
      r.close();
      const all = new ProcTaskReader('/proc', { relistEvery: 1_000_000, gate: false });
      for (const pid of pids) all.read(pid);
      const everyLine = steady(all);
      all.close();
      console.log(
        `${String(seen).padStart(7)} ${String(pids.length).padStart(7)}   ${(first / seen).toFixed(2).padStart(38)}   ${`${gated.toFixed(2)} / ${everyLine.toFixed(2)}`.padStart(41)}   ${String(fds).padStart(5)}`,
      );
    } catch (e) {
      console.log(`${String(threads).padStart(7)}   could not run: ${(e as Error).message}`);
    } finally {
      for (const p of procs) p.kill('SIGKILL');
      await Promise.all(
        procs.map((p) => (p.exitCode === null && p.signalCode === null ? new Promise((res) => p.once('exit', res)) : null)),
      );
    }
  }
}
