/** The command line as a user meets it: help (commands first, with examples), --version everywhere, usage errors naming the right --help, record's output file. */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { BIN, ensureBuilt, ROOT, tempDir } from '../daemon/support/daemon-process.js';
import { buildCli } from '../../src/cli/cli.js';
import { COMMAND_EXAMPLES, DAEMON_EXAMPLE } from '../../src/cli/help.js';
import { FakeHost } from '../support/fake-host.js';
import { readTrace } from '../../src/trace/reader.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  ensureBuilt();
  return new Promise((resolve) =>
    execFile(process.execPath, [BIN, ...args], (e, stdout, stderr) =>
      resolve({ code: e ? Number((e as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    ),
  );
}

describe('help', () => {
  test("`vmsr-helper help` lists the commands and `help record` shows record's options", async () => {
    const top = await cli(['help']);
    expect(top.code).toBe(0);
    expect(top.stdout).toMatch(/Usage: vmsr-helper \[options\] \[command\]/);
    for (const c of ['record', 'replay', 'watch', 'help']) expect(top.stdout).toMatch(new RegExp(`^  ${c}\\b`, 'm'));
    const rec = await cli(['help', 'record']);
    expect(rec.code).toBe(0);
    expect(rec.stdout).toMatch(/Usage: vmsr-helper record \[options\]/);
    expect(rec.stdout).toContain('--force');
  });

  test("--help lists the commands first, each with its example, then the daemon's options", async () => {
    const top = await cli(['--help']);
    expect(top.code).toBe(0);
    const commands = top.stdout.indexOf('\nCommands:\n');
    const options = top.stdout.indexOf('\nOptions of the daemon (vmsr-helper without a command):\n');
    expect(commands).toBeGreaterThan(0);
    expect(options).toBeGreaterThan(commands);
    const program = await buildCli(true);
    for (const cmd of program.commands) {
      const example = COMMAND_EXAMPLES[cmd.name()];
      expect(example, `an example for ${cmd.name()}`).toBeDefined();
      // The example sits under its command, before the next one (help wraps long lines).
      const at = top.stdout.indexOf(`\n  ${cmd.name()} `);
      expect(at, cmd.name()).toBeGreaterThan(commands);
      const rest = top.stdout.slice(at + 1);
      const next = rest.search(/\n {2}\S|\n\n/);
      const block = rest.slice(0, next < 0 ? undefined : next);
      expect(block.replace(/\s+/g, ' '), cmd.name()).toContain(`e.g. ${example}`);
      // And at the end of its own --help.
      const own = await cli([cmd.name(), '--help']);
      expect(own.stdout, cmd.name()).toContain(`Example:\n  ${example}\n`);
    }
    expect(top.stdout).toContain(`  ${DAEMON_EXAMPLE}`);
  });

  test('every command answers --version and -V with the version', async () => {
    const version = `vmsr-helper ${(JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }).version}\n`;
    const program = await buildCli(true);
    for (const args of [[], ...program.commands.map((c) => [c.name()])]) {
      for (const flag of ['--version', '-V']) {
        const r = await cli([...args, flag]);
        expect({ args, flag, code: r.code, out: r.stdout }).toEqual({ args, flag, code: 0, out: version });
      }
    }
  });

  test("a subcommand's usage error points at that subcommand's --help", async () => {
    const bad = await cli(['record', '-o', '/nonexistent/x.jsonl', '--pid', 'x']);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/not a process id: "x"\n\(run 'vmsr-helper record --help' for the options\)/);
    const watch = await cli(['watch', '--pid', '1']);
    expect(watch.code).toBe(1);
    expect(watch.stderr).toBe("vmsr-helper watch: --pid needs --vcpus TID:VPKG,...\n(run 'vmsr-helper watch --help' for the options)\n");
    const replay = await cli(['replay', 'a', 'b']);
    expect(replay.stderr).toMatch(/too many arguments for 'replay'[\s\S]*vmsr-helper replay --help/);
    // The root's own errors still name the root's help.
    const root = await cli(['--no-such-option']);
    expect(root.stderr).toMatch(/unknown option '--no-such-option'\n\(run 'vmsr-helper --help' for the options\)/);
  });

  test('watch --qmp that cannot reach QEMU points at watch NAME, which needs no QMP', async () => {
    const r = await cli(['watch', '--qmp', '/nonexistent/vm.qmp']);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('QMP socket /nonexistent/vm.qmp does not exist');
    expect(r.stderr).toContain("a VM the helper discovered needs no QMP: vmsr-helper watch NAME (its name as 'virsh list' shows it");
  });

  test('an unknown command is named as such and the nearest command is suggested when one is near', async () => {
    const near = await cli(['export']);
    expect(near.code).toBe(1);
    expect(near.stderr).toBe("error: unknown command 'export'\n(Did you mean exporter?)\n(run 'vmsr-helper --help' for the options)\n");
    // After the daemon's options too, and with nothing near: no suggestion, still "unknown command".
    const far = await cli(['-k', '/run/x.sock', 'zzzz']);
    expect(far.code).toBe(1);
    expect(far.stderr).toBe("error: unknown command 'zzzz'\n(run 'vmsr-helper --help' for the options)\n");
    expect((await cli(['wach'])).stderr).toContain('(Did you mean watch?)');
  });
});

describe('record output file', () => {
  test('record refuses to overwrite an existing trace without --force, and replaces it with --force', async () => {
    const d = tempDir('vmsr-cli-');
    cleanups.push(() => fs.rmSync(d, { recursive: true, force: true }));
    const host = new FakeHost();
    cleanups.push(() => host.cleanup());
    const out = path.join(d, 'host.jsonl');
    fs.writeFileSync(out, 'precious\n');
    // A synthetic energy source (this host has no RAPL); this test process is the "VM".
    const args = [
      'record',
      '--energy-source',
      'synthetic',
      '--sys-root',
      host.sysRoot,
      '--pid',
      String(process.pid),
      '--vcpus',
      `${process.pid}:0`,
      '-o',
      out,
      '--duration',
      '0.2',
      '--interval',
      '0.05',
    ];
    const refused = await cli(args);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain(`cannot write trace ${out}: the file exists; give --force to overwrite it, or another file name`);
    expect(fs.readFileSync(out, 'utf8')).toBe('precious\n');
    const forced = await cli([...args, '--force']);
    expect(forced.code, forced.stderr).toBe(0);
    const types: string[] = [];
    for await (const r of readTrace(out)) types.push(r.type);
    expect(types[0]).toBe('header');
    expect(types).toContain('sample');
  });
});
