/**
 * A user with subordinate uids (useradd gives each new user 65,536 in /etc/subuid) runs processes as
 * any of them, and the kernel reports those uids for their sockets: the exporter counted each as an
 * owner of its own in its connection shares, so 40 of them, each holding a connection reopened as
 * soon as it is closed, were 40 small owners, and 48 of 48 scrapes whose request came 10 ms after
 * connecting failed. A subordinate range is now its user: one owner, the one holding the most.
 * Here 40 real processes, each of its own uid of one range written into /etc/subuid (the line
 * removed afterwards), hold connections to the real exporter (of uid nobody), idle in one test and
 * pipelining requests they never read, as fast as the exporter takes them, in the other, while this process (root: another user) scrapes.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import { describe, expect, test } from 'vitest';
import { PYTHON } from '../support/fake-qemu.js';
import { waitFor } from '../support/wait.js';
import { fakeHost, NOBODY, notRoot, onCleanup, sleep, startExporterProcess } from './support.js';

const why = notRoot();
const UIDS = 40;
const SCRAPES = 48;
const SUBUID = '/etc/subuid';

/**
 * Forks one child per uid of argv[2] (comma-separated), each setting that uid and keeping argv[3]
 * connections to 127.0.0.1:argv[1] open, each reopened once the exporter closes it; with argv[4]
 * "busy" each connection pipelines requests as fast as the exporter takes them and never reads. Each child prints "up" once.
 */
const HOARDERS = String.raw`
import ctypes, os, select, socket, sys, time
port, uids, per, busy = int(sys.argv[1]), [int(u) for u in sys.argv[2].split(",")], int(sys.argv[3]), sys.argv[4] == "busy"
REQ = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 8
libc = ctypes.CDLL(None)
def hoard():
    p = select.poll(); conns = {}
    def open1():
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", port))
            if busy: s.send(REQ)
        except OSError:
            s.close(); time.sleep(0.01); return
        conns[s.fileno()] = s; p.register(s, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    while len(conns) < per: open1()
    os.write(1, b"up\n")
    while True:
        for fd, _ in p.poll(10 if busy else 100):
            p.unregister(fd); conns.pop(fd).close()
        while len(conns) < per: open1()
        for c in conns.values() if busy else ():
            try: c.send(REQ, socket.MSG_DONTWAIT)
            except OSError: pass
for uid in uids:
    if os.fork() == 0:
        os.setgroups([]); os.setgid(uid); os.setuid(uid)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG (after setuid, which clears it): SIGKILL when the parent ends
        if os.getppid() == 1: os._exit(1)
        hoard()
os.wait()
`;

/** One scrape whose request is sent `delayMs` after its connection opened; resolves true on a whole 200. */
function scrape(port: number, delayMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let got = '';
    const done = (ok: boolean) => {
      s.destroy();
      resolve(ok);
    };
    // Prometheus's default scrape_timeout: a scrape answered within it succeeds, as Prometheus judges it.
    s.setTimeout(10_000, () => done(false));
    s.on('error', () => done(false));
    s.on('close', () => done(/^HTTP\/1\.1 200/.test(got) && got.includes('vmsr_helper_')));
    s.on('data', (d: Buffer) => {
      got += d.toString();
      if (got.includes('\r\n0\r\n\r\n') || got.includes('# EOF')) done(/^HTTP\/1\.1 200/.test(got));
    });
    s.on('connect', () => setTimeout(() => s.write('GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'), delayMs));
  });
}

/** A range of 65,536 subordinate uids no process on the host runs as, written into /etc/subuid for the test. */
function subordinateRange(): number {
  const start = 1_000_000_000 + Math.floor(Math.random() * 10_000) * 65_536;
  const line = `vmsr-test-${process.pid}-${start}:${start}:65536`;
  const before = fs.existsSync(SUBUID) ? fs.readFileSync(SUBUID, 'utf8') : null;
  fs.writeFileSync(SUBUID, `${before ?? ''}${before === null || before === '' || before.endsWith('\n') ? '' : '\n'}${line}\n`);
  onCleanup(() => {
    // Only this test's line goes: another may have changed the file meanwhile.
    const now = fs
      .readFileSync(SUBUID, 'utf8')
      .split('\n')
      .filter((l) => l !== line);
    if (before === null && now.join('') === '') fs.rmSync(SUBUID);
    else fs.writeFileSync(SUBUID, now.join('\n'));
  });
  return start;
}

describe.skipIf(why !== null)('subordinate uids against the exporter', () => {
  if (why !== null) console.log(`skipped: ${why}`);

  test.each(['idle', 'busy'])(
    `every one of ${SCRAPES} scrapes (request 10 ms after connecting) succeeds while ${UIDS} subordinate uids of one user hold %s connections`,
    async (mode) => {
      const start = subordinateRange();
      const { sock } = fakeHost();
      const { child, port } = await startExporterProcess(sock, NOBODY);
      const uids = Array.from({ length: UIDS }, (_, i) => start + i);
      const hoarders = spawn(PYTHON, ['-c', HOARDERS, String(port), uids.join(','), '1', mode], { stdio: ['ignore', 'pipe', 'inherit'] });
      onCleanup(() => void hoarders.kill('SIGKILL'));
      let up = 0;
      hoarders.stdout.on('data', (d: Buffer) => (up += d.toString().split('up').length - 1));
      await waitFor(() => up >= UIDS, `the ${UIDS} hoarders to have opened their connections`, child, 60_000);
      await sleep(1_000);
      let ok = 0;
      for (let i = 0; i < SCRAPES; i++) {
        if (await scrape(port, 10)) ok++;
        await sleep(100);
      }
      console.log(`${mode}: ${ok} of ${SCRAPES} scrapes answered beside ${UIDS} subordinate uids`);
      expect(ok).toBe(SCRAPES);
      expect(child.proc.exitCode).toBeNull();
    },
    180_000,
  );
});
