/**
 * A process of the daemon's (or the exporter's) uid sends SIGUSR1, which makes
 * Node 20 open its inspector, a debugger any local user could connect to and run code with. The
 * attack runs as uid nobody against the real daemon dropped to -u nobody and the real exporter.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { describe, expect, test } from 'vitest';
import { LineReader } from '../support/line-reader.js';
import { SIGUSR1_MESSAGE } from '../../src/os/inspector-guard.js';
import { hostArgs, LegacyClient, startHelper, waitFor } from '../daemon/support/daemon-process.js';
import { fakeHost, killAs, NOBODY, notRoot, onCleanup, sleep, startExporterProcess, tcpListeningPorts, track } from './support.js';

/** How long a listener has to appear after the signal was taken (Node opens the inspector within milliseconds). */
const INSPECTOR_WAIT_MS = 1500;

describe('SIGUSR1 from a process of the same uid', () => {
  test('the probe sees the inspector Node opens on SIGUSR1 when nothing guards the process (the check can fail)', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    // Port 0: an inspector on a free port, so another process holding 9229 does not hide it.
    const bare = spawn(process.execPath, ['--inspect-port=0', '-e', 'setInterval(() => {}, 1000); console.log("ready")'], {
      uid: NOBODY,
      gid: NOBODY,
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    onCleanup(() => void bare.kill('SIGKILL'));
    // Running its script: Node's SIGUSR1 handling is in place (before it, SIGUSR1 would end it).
    expect(await new LineReader(bare).next()).toBe('ready');
    expect(tcpListeningPorts(bare.pid!)).toEqual([]);
    expect(await killAs(NOBODY, 'USR1', bare.pid!)).toBe(0);
    await waitFor(() => tcpListeningPorts(bare.pid!).length === 1, 'the unguarded node to open its inspector');
  });

  test('the daemon dropped to -u nobody opens no TCP listener when uid nobody sends it SIGUSR1, warns, and still answers legacy requests', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { host, sock } = fakeHost();
    const child = track(await startHelper(['-k', sock, '-u', 'nobody', ...hostArgs(host)]));
    const pid = child.proc.pid!;
    const c = await LegacyClient.connect(sock);
    onCleanup(() => c.close());
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    for (let i = 0; i < 3; i++) expect(await killAs(NOBODY, 'USR1', pid)).toBe(0);
    // Its warning says the signal was taken (a busy host may take seconds); then the time an inspector would take.
    await waitFor(() => child.stderr().includes(SIGUSR1_MESSAGE), 'the daemon to warn of the SIGUSR1', child);
    await sleep(INSPECTOR_WAIT_MS);
    expect(tcpListeningPorts(pid)).toEqual([]);
    expect(child.proc.exitCode).toBeNull();
    // Rate-limited: three signals, one warning.
    expect(
      child
        .stderr()
        .split('\n')
        .filter((l) => l.includes(SIGUSR1_MESSAGE)),
    ).toHaveLength(1);
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
  });

  test('the exporter running as uid nobody opens no listener beside its metrics port when uid nobody sends it SIGUSR1, and still serves', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { sock } = fakeHost();
    const { child, url, port } = await startExporterProcess(sock, NOBODY);
    const pid = child.proc.pid!;
    expect(tcpListeningPorts(pid)).toEqual([port]);
    expect(await killAs(NOBODY, 'USR1', pid)).toBe(0);
    await waitFor(() => child.stderr().includes(SIGUSR1_MESSAGE), 'the exporter to warn of the SIGUSR1', child);
    await sleep(INSPECTOR_WAIT_MS);
    expect(tcpListeningPorts(pid)).toEqual([port]);
    const res = await fetch(url);
    expect(res.status).toBe(200);
    expect(await res.text()).toContain('vmsr_exporter_helper_connected 0');
  });
});

describe('Node flags and NODE_OPTIONS of the first image', () => {
  test('NODE_OPTIONS=--inspect given to the daemon is not passed to the re-executed image: not in its environ or cmdline, and no TCP listener', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { host, sock } = fakeHost();
    const child = track(
      await startHelper(['-k', sock, '-u', 'nobody', ...hostArgs(host)], {
        env: { ...process.env, NODE_OPTIONS: '--inspect=127.0.0.1:0' },
      }),
    );
    const pid = child.proc.pid!;
    const environ = fs.readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
    expect(environ.filter((e) => e.startsWith('NODE_OPTIONS='))).toEqual([]);
    // It is the re-executed image (exec's environ is what the image was started with).
    expect(environ).toContain('VMSR_HELPER_REEXEC=1');
    const cmdline = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    expect(cmdline.filter((a) => /^--(inspect|debug|require|import|loader|experimental-loader)/.test(a) || a === '-r')).toEqual([]);
    expect(tcpListeningPorts(pid)).toEqual([]);
    // And a SIGUSR1 from nobody still opens nothing in that image.
    expect(await killAs(NOBODY, 'USR1', pid)).toBe(0);
    await sleep(INSPECTOR_WAIT_MS);
    expect(tcpListeningPorts(pid)).toEqual([]);
    const c = await LegacyClient.connect(sock);
    onCleanup(() => c.close());
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
  });
});
