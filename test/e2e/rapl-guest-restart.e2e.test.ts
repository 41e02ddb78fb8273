/**
 * Restarts of vmsr-helper under a real QEMU 10 guest (docs/daemon.md "Restarts"): QEMU connects
 * once and never reconnects, so the guest's virtual RAPL counter goes on only if every restart hands
 * QEMU's connection over. Real parts only, as in rapl-guest.e2e.test.ts: the built daemon, the
 * installed qemu-system-x86_64 with -accel kvm,rapl=true (test/support/rapl-qemu.ts), the guest in
 * mode s printing its 0x611 on COM1 each time it changed; the one fake is the MSR file (FakeHost), its
 * package counter driven by an EnergyPump.
 *
 * QEMU's vmsr thread asks for the package counter, sleeps 1 s, asks again, and adds its split of the
 * difference to the guest's counter (test/support/qemu-vmsr-model.ts): the guest's 0x611 steps up
 * once a period, and the guest prints a line per step, within milliseconds. QEMU's read blocks until
 * the helper answers, so a restart stretches the period that waits for it by the time the helper did
 * not serve. What must hold across 5 restarts, in place (SIGHUP and `vmsr-helper reload`) and through
 * systemd's fd store (`systemctl restart`, with the real systemd of
 * test/restart/support/service-manager.ts, QEMU inside its PID namespace):
 *
 * - the guest's 0x611 never goes backwards;
 * - it stands still (the time between two of its lines as the test saw them appear, polled every
 *   20 ms, and after the last one) no longer than one QEMU period (as long as the longest seen
 *   without restarts, at least 1 s) plus the longest time the helper did not serve in a restart, plus
 *   QEMU_SLACK_MS: a restart costs the guest its stall and nothing more (a request lost in the
 *   hand-over would leave QEMU's read blocked, the counter still for good);
 * - the daemon's legacy counters go on across every restart, none refused or failed;
 * - QEMU, the same process all along, connected once, and its one connection was handed over each time.
 *
 * The goal of two QEMU periods (2 s) as the longest standstill is printed, met or not, and not
 * asserted: it is a matter of timing, met with the helper's restart taking under about a second, which
 * it does not on a heavily loaded 2-core machine (docs/daemon.md "Restarts" has the figures).
 */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterEach, describe, expect } from 'vitest';
import { BIN, hostArgs, startHelper, waitFor } from '../daemon/support/daemon-process.js';
import { legacyCounters, type LegacyCounters } from '../restart/support/legacy-counters.js';
import { UNIT } from '../restart/support/service-manager.js';
import { pumpedRaplHost, raplTest, raplUnderSystemd, starttime, steppingGuest } from './support.js';
import { startRaplQemu, type RaplQemu } from '../support/rapl-qemu.js';

const cleanups: (() => Promise<unknown> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const RESTARTS = 5;
/** QEMU's vmsr thread: one 1 s sleep between its two reads of a period. */
const QEMU_PERIOD_MS = 1000;
/** The goal for the longest the guest's 0x611 stands still: two QEMU periods (printed, not asserted). */
const GOAL_STILL_MS = 2 * QEMU_PERIOD_MS;
/**
 * What else may delay a step on a loaded machine beyond the baseline period and the helper's stall:
 * QEMU's reply read and wake-up after the stall, the guest's next read, the test's polling.
 */
const QEMU_SLACK_MS = 500;
/** Watched before the first restart, to show the guest's stepping without restarts. */
const BASELINE_MS = 6000;
/** Package counter start (its top byte stays 0x2a during a test: see raplFakeHost) and rate. */
const E0 = 0x2a00_0000;
const RATE = 120_000;
const LONG = 300_000;

/** How one way of restarting is driven and watched. */
interface Restarts {
  label: string;
  /**
   * Restart number i (from 0); resolves once the new image serves (its "handed over:" is logged),
   * with how long the helper did not serve QEMU (ms).
   */
  restart(i: number): Promise<number>;
  counters(): Promise<LegacyCounters>;
  /** The daemon's log, every image of it. */
  log(): string;
}

const count = (text: string, needle: string) => text.split(needle).length - 1;

/**
 * Drives RESTARTS restarts under a running RAPL guest and checks what the file's header says must
 * hold. `peerPid` is QEMU's pid as the daemon sees it.
 */
async function guestAcrossRestarts(r: Restarts, q: RaplQemu, peerPid: number): Promise<void> {
  const qemuStart = starttime(q.pid);
  const { serial, steps, stop } = await steppingGuest(q, cleanups);
  const baselineFrom = steps() - 1;
  await new Promise((res) => setTimeout(res, BASELINE_MS));
  const baselineTo = steps();

  const seen: LegacyCounters[] = [await r.counters()];
  const stalls: number[] = [];
  const restartedAt: number[] = [];
  for (let i = 0; i < RESTARTS; i++) {
    restartedAt.push(Date.now());
    stalls.push(await r.restart(i));
    // QEMU goes on through the new image: two more steps before the next restart.
    const at = steps();
    await serial.waitFor(() => steps() >= at + 2, `the guest 0x611 to step up twice after restart ${i + 1}`, 30_000, q);
    seen.push(await r.counters());
  }
  const tailFrom = Date.now();
  await serial.waitFor(() => Date.now() > tailFrom + 3000, 'three more seconds of the guest', 30_000, q);
  stop();
  const endedAt = Date.now();

  // Each line is a step (mode s): the first was printed at the guest's start, not at a step.
  const lines = serial.energy();
  const gaps = lines.slice(2).map((l, k) => ({ ms: l.seenAt - lines[k + 1]!.seenAt, at: lines[k + 1]!.seenAt }));
  const longest = (gs: readonly { ms: number }[]) => Math.max(0, ...gs.map((g) => g.ms));
  const nearRestart = (g: { ms: number; at: number }) => restartedAt.some((t) => g.at + g.ms >= t && g.at <= t + 5000);
  const baseline = gaps.slice(baselineFrom - 1, baselineTo - 2);
  const log = r.log();
  const bound = Math.max(QEMU_PERIOD_MS, longest(baseline)) + Math.max(...stalls) + QEMU_SLACK_MS;
  const still = Math.max(longest(gaps), endedAt - lines.at(-1)!.seenAt);
  // QEMU splits a stretched period's energy by one second's ticks: the step after a stall is larger.
  const sizes = lines.slice(2).map((l, k) => Number(l.value - lines[k + 1]!.value));
  const median = [...sizes].sort((a, b) => a - b)[Math.floor(sizes.length / 2)]!;
  console.log(
    `${r.label}: ${RESTARTS} restarts, the helper not serving (ms) ${stalls.map((x) => Math.round(x)).join(', ')}; ` +
      `guest 0x611 stepped ${lines.length - 1} times; longest time between two steps ${longest(gaps)} ms ` +
      `(${longest(gaps.filter(nearRestart))} ms around the restarts, ${longest(baseline)} ms over ${BASELINE_MS / 1000} s without restarts), ` +
      `after the last ${endedAt - lines.at(-1)!.seenAt} ms; bound ${Math.round(bound)} ms; goal of two QEMU periods (${GOAL_STILL_MS} ms): ` +
      `${still <= GOAL_STILL_MS ? 'met' : 'NOT met'}; largest step ${(Math.max(...sizes) / median).toFixed(2)} x the median one; legacy requests answered ${seen.map((c) => c.ok).join(' -> ')}`,
  );

  for (let k = 1; k < lines.length; k++)
    expect(lines[k]!.value, `guest 0x611 line ${k} never goes back`).toBeGreaterThanOrEqual(lines[k - 1]!.value);
  expect(lines.length, 'the guest 0x611 stepped up after every restart').toBeGreaterThan(2 * RESTARTS + 3);
  for (const g of gaps)
    expect(g.ms, 'the guest 0x611 stood still no longer than a period and the longest stall').toBeLessThanOrEqual(bound);
  expect(endedAt - lines.at(-1)!.seenAt, 'nor after its last step').toBeLessThanOrEqual(bound);

  for (const c of seen) expect(c, 'no legacy request refused or failed').toMatchObject({ refused: 0, failed: 0 });
  for (let k = 1; k < seen.length; k++)
    expect(seen[k]!.ok, `legacy requests answered go on across restart ${k}`).toBeGreaterThan(seen[k - 1]!.ok);

  expect(q.alive(), 'QEMU keeps running').toBe(true);
  expect(starttime(q.pid), 'the same QEMU process all along').toBe(qemuStart);
  expect(q.stderr(), 'QEMU says nothing about its helper').not.toMatch(/vmsr|rapl|helper|socket/i);
  const qemuLines = (msg: string) => log.split('\n').filter((l) => l.includes(`"peer":${peerPid},`) && l.includes(`"msg":"${msg}"`));
  expect(qemuLines('client connected'), 'QEMU connected once, never again').toHaveLength(1);
  expect(qemuLines('client connection handed over'), "QEMU's connection adopted by each new image").toHaveLength(RESTARTS);
}

/** 5 restarts in place (SIGHUP to the process started, and `vmsr-helper reload`) of a helper started with `args`. */
async function inPlace(label: string, name: string, args: string[]): Promise<void> {
  const { host, dir } = pumpedRaplHost((c) => cleanups.push(c), { start: E0, rate: RATE, prefix: 'vmsr-rapl-restart-' });
  const sock = path.join(dir, 'vmsr.sock');
  // -T server: the connection log line names QEMU's pid.
  const h = await startHelper([...args, '-k', sock, ...hostArgs(host, 'intel'), '-T', 'server']);
  cleanups.push(() => h.stop());
  const q = await startRaplQemu({ socket: sock, dir, name, mode: 's' });
  cleanups.push(() => q.stop());
  const run = promisify(execFile);
  const phases = () =>
    h
      .stderr()
      .split('\n')
      .filter((l) => l.includes('"msg":"restart phases"'))
      .map((l) => JSON.parse(l) as { stoppedToServingMs: number; servicesMs: number });
  await guestAcrossRestarts(
    {
      label,
      async restart(i) {
        if (i % 2 === 0) h.proc.kill('SIGHUP');
        else await run(process.execPath, [BIN, 'reload', '-k', sock], { timeout: 30_000 });
        // The new image logs its phases once its services are set up: stopped reading to serving,
        // then the services' set-up, which holds the first replies (docs/daemon.md "Restarts").
        await waitFor(() => phases().length > i, `restart ${i + 1} to serve again`, h, 30_000);
        const p = phases()[i]!;
        return p.stoppedToServingMs + p.servicesMs;
      },
      counters: () => legacyCounters(sock),
      log: () => h.stderr(),
    },
    q,
    q.pid,
  );
}

describe('a real QEMU 10 guest across helper restarts', () => {
  raplTest(
    "the guest's 0x611 keeps stepping up (never still longer than a QEMU period plus the time the helper did not serve, never back) and QEMU keeps its one connection, when the helper is restarted in place 5 times by SIGHUP and vmsr-helper reload",
    () => inPlace('in place (SIGHUP, reload, SIGHUP, reload, SIGHUP)', 'rapl-in-place', []),
    LONG,
  );

  raplTest(
    'the same under the keeper, every process without privilege: SIGHUP and vmsr-helper reload reach the keeper, which passes them on; the guest steps on and QEMU keeps its one connection',
    () => inPlace('in place under the keeper (SIGHUP, reload, ... to the keeper)', 'rapl-in-place-keeper', ['--keeper']),
    LONG,
  );

  raplTest(
    "the guest's 0x611 keeps stepping up (never still longer than a QEMU period plus the time the helper did not serve, never back) and QEMU keeps its one connection, when the helper is restarted 5 times by systemctl restart through systemd's fd store",
    async (skip) => {
      const s = await raplUnderSystemd(cleanups, skip, {
        start: E0,
        rate: RATE,
        prefix: 'vmsr-rapl-restart-',
        what: 'fd-store restarts under a real guest',
      });
      if (!s) return;
      const { m, dir, sock, log } = s;
      console.log(`fd-store restarts under a real guest run under: real systemd (${m.version}) as PID 1 of a new PID namespace`);
      // QEMU shares the helper's PID namespace (the helper refuses a peer it sees as pid 0).
      const q = await startRaplQemu({ socket: sock, dir, name: 'rapl-fd-store', mode: 's', inside: (a) => m.inside(a) });
      cleanups.push(() => q.stop());
      await guestAcrossRestarts(
        {
          label: `systemctl restart (${m.version})`,
          async restart(i) {
            // From the stop's start to the new daemon serving: no phases are logged for a start from the fd store.
            const before = count(log(), '"msg":"handed over:');
            const t0 = performance.now();
            await m.systemctlAsync('restart', `${UNIT}.service`);
            await waitFor(() => count(log(), '"msg":"handed over:') > before, `restart ${i + 1} to serve again`, undefined, 30_000);
            return performance.now() - t0;
          },
          counters: () => legacyCounters(sock, (a) => m.inside(a)),
          log,
        },
        q,
        q.nsPid,
      );
      expect(count(log(), 'handed over to the fd store (FDSTORE=1)')).toBe(RESTARTS);
    },
    LONG,
  );
});
