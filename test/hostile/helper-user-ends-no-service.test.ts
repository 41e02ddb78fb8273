/**
 * The -u user (any process of its uid) against the real daemon with its keeper (-u nobody): the
 * keeper runs with real and saved uid 0 and no capability, so that user cannot signal it at all;
 * what it sends the serving process (SIGKILL, SIGTERM, SIGALRM, more times in a row than the crash
 * limit) ends that process, and the keeper starts it again with QEMU's connection each time, never
 * counting it. A SIGSTOP of that user (past the watchdog's 10 s, it ended the process as a hang,
 * counted: five stopped the keeper) is undone: the keeper continues a stopped serving process. A
 * loop that really hangs is still a crash: the serving process held by a debugger's stop (ptrace,
 * root only; standing for a hung loop) for longer than its loop watchdog allows dies by its own
 * SIGALRM, and that many in a row stop the keeper, saying why (docs/security.md "The -u user
 * ending the service").
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import { describe, expect, test } from 'vitest';
import { KEEPER_LIMITS } from '../../src/keeper/keeper.js';
import { LegacyClient, listenings, servingPid, waitFor } from '../daemon/support/daemon-process.js';
import { processEnded } from '../support/wait.js';
import { killAs, NOBODY, notRoot, onCleanup, sleep, startDaemonOpenToAll } from './support.js';

const why = notRoot();

/** The Uid line of /proc/PID/status: real, effective, saved, filesystem. */
const uids = (pid: number) =>
  /^Uid:\s+(.*)$/m
    .exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))![1]!
    .trim()
    .split(/\s+/)
    .map(Number);
const status = (pid: number, field: string) =>
  new RegExp(`^${field}:\\s*(\\S+)`, 'm').exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];

/** Stops pid argv[1] as a debugger does (PTRACE_SEIZE, PTRACE_INTERRUPT) for argv[2] s; the tracer's exit lets it go. */
const PTRACE_HOLD = String.raw`
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
pid = int(sys.argv[1])
if libc.ptrace(0x4206, pid, 0, 0) != 0 or libc.ptrace(0x4207, pid, 0, 0) != 0:
    sys.exit("cannot ptrace %d: errno %d" % (pid, ctypes.get_errno()))
time.sleep(float(sys.argv[2]))
`;

describe.skipIf(why !== null)('the -u user ending the service', () => {
  if (why !== null) console.log(`skipped: ${why}`);

  test(`-u's user cannot signal the keeper, and ${KEEPER_LIMITS.maxCrashesInARow + 1} SIGKILLs, SIGTERMs and SIGALRMs of the serving process are restarts that never stop it`, async () => {
    const { daemon, sock } = await startDaemonOpenToAll(['--keeper']);
    const keeper = daemon.proc.pid!;
    const qemu = await LegacyClient.connect(sock);
    onCleanup(() => qemu.close());
    expect(await qemu.request(0x606, 0, process.pid)).toBe(0xa1003n);
    expect(uids(keeper), 'the keeper: real and saved uid 0, effective and filesystem uid nobody').toEqual([0, NOBODY, 0, NOBODY]);
    for (const set of ['CapEff', 'CapPrm', 'CapBnd', 'CapInh', 'CapAmb'])
      expect(status(keeper, set), `the keeper's ${set}`).toBe('0000000000000000');
    expect(uids(servingPid(keeper)), 'the serving process: nobody as all four').toEqual([NOBODY, NOBODY, NOBODY, NOBODY]);
    for (const sig of ['TERM', 'KILL', 'INT', 'HUP'])
      expect(await killAs(NOBODY, sig, keeper), `kill -${sig} of the keeper as nobody`).not.toBe(0);

    const sigs = ['KILL', 'TERM', 'ALRM'] as const;
    for (let i = 0; i <= KEEPER_LIMITS.maxCrashesInARow; i++) {
      const sig = sigs[i % sigs.length]!;
      const serving = servingPid(keeper);
      const started = listenings(daemon);
      expect(await killAs(NOBODY, sig, serving), `kill -${sig} of the serving process as nobody`).toBe(0);
      await waitFor(() => listenings(daemon) > started, `the serving process started again after SIG${sig}`, daemon, 60_000);
      expect(servingPid(keeper)).not.toBe(serving);
    }
    expect(daemon.proc.exitCode, 'the keeper serves on').toBeNull();
    expect(await qemu.request(0x606, 0, process.pid), "QEMU's connection is answered by the last serving process").toBe(0xa1003n);
    const log = daemon.stderr();
    for (const how of ['SIGKILL', 'SIGALRM', 'a SIGTERM or SIGINT'])
      expect(log, how).toContain(`keeper: the serving process was ended by ${how} from another process (not a crash`);
    expect(log).not.toContain('keeper: the serving process died');
    expect(uids(servingPid(keeper)), 'restarted serving processes drop real uid 0 too').toEqual([NOBODY, NOBODY, NOBODY, NOBODY]);
  }, 180_000);

  test("a SIGSTOP of the serving process by -u's user for longer than its watchdog allows is undone by the keeper: the same process serves on", async () => {
    const { daemon, sock } = await startDaemonOpenToAll(['--keeper']);
    const keeper = daemon.proc.pid!;
    const qemu = await LegacyClient.connect(sock);
    onCleanup(() => qemu.close());
    const serving = servingPid(keeper);
    for (const sig of ['STOP', 'TSTP']) {
      expect(await killAs(NOBODY, sig, serving), `kill -${sig} as nobody`).toBe(0);
      // Waited for: past the watchdog's 10 s (the old keeper let the alarm end it, counted as a hang).
      await sleep(12_000);
      expect(status(serving, 'State'), `after a SIG${sig}: running or sleeping, not stopped`).toMatch(/^[RSD]$/);
    }
    expect(servingPid(keeper), 'the same serving process').toBe(serving);
    expect(await qemu.request(0x606, 0, process.pid), 'QEMU is answered on its connection').toBe(0xa1003n);
    expect(daemon.stderr()).toContain('keeper: the serving process was stopped by a signal from another process (SIGSTOP): continued');
    expect(daemon.stderr()).not.toContain('keeper: the serving process died');
  }, 120_000);

  test(`a serving process whose loop hangs after every start is ended by its watchdog, and ${KEEPER_LIMITS.maxCrashesInARow} of those in a row stop the keeper`, async () => {
    const { daemon } = await startDaemonOpenToAll(['--keeper']);
    const keeper = daemon.proc.pid!;
    for (let i = 0; i < KEEPER_LIMITS.maxCrashesInARow; i++) {
      if (i > 0) await waitFor(() => listenings(daemon) > i, `start ${i + 1} of the serving process`, daemon, 60_000);
      const serving = servingPid(keeper);
      // Held by a debugger (ptrace, state t: not a SIGSTOP, which the keeper undoes) for longer than
      // the watchdog's 10 s: its loop turns no more, its alarm stays armed; let go when the tracer ends.
      execFileSync('python3', ['-c', PTRACE_HOLD, String(serving), '11.5']);
      await waitFor(() => processEnded(serving), `serving process ${serving} to die by its SIGALRM`, undefined, 30_000);
    }
    expect(await daemon.exited).toBe(1);
    expect(daemon.stderr()).toMatch(
      new RegExp(`the serving process died ${KEEPER_LIMITS.maxCrashesInARow} times in a row \\(the last: SIGALRM\\): the keeper stops`),
    );
    expect(daemon.stderr()).not.toContain('ended by SIGALRM from another process');
  }, 240_000);
});
