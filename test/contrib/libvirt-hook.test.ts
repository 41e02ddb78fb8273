/**
 * contrib/libvirt/hooks/qemu run as libvirt runs it (`qemu <domain> <operation> <sub-op> <extra>`,
 * the domain XML on stdin): prepare makes DIR/<uuid>/ (0755), release removes it, other operations
 * do nothing, and nothing makes it fail a domain's start or touch what a symlink names.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';

const HOOK = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../contrib/libvirt/hooks/qemu');
const UUID = '5e1f0a3c-1d2e-4f60-8a9b-0c1d2e3f4a5b';
const xml = (uuid: string) => `<domain type='kvm'>\n  <name>web</name>\n  <uuid>${uuid}</uuid>\n  <memory>1</memory>\n</domain>\n`;

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});

function hook(dir: string, args: string[], stdin: string) {
  return spawnSync(HOOK, args, { input: stdin, encoding: 'utf8', env: { PATH: process.env.PATH, VMSR_GUEST_DIR: dir } });
}

describe('the libvirt hook', () => {
  it('makes DIR/<uuid>/ when a domain is prepared and removes it, with the tree in it, when it is released', () => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-hook-'));
    dirs.push(root);
    const dir = path.join(root, 'guests');
    const r = hook(dir, ['web', 'prepare', 'begin', '-'], xml(UUID.toUpperCase()));
    expect(r.status, r.stderr).toBe(0);
    const st = fs.statSync(path.join(dir, UUID));
    expect(st.isDirectory()).toBe(true);
    expect(st.mode & 0o777).toBe(0o755);
    fs.mkdirSync(path.join(dir, UUID, 'intel-rapl:0'));
    fs.writeFileSync(path.join(dir, UUID, 'intel-rapl:0/energy_uj'), '1\n');
    for (const op of ['start', 'started', 'stopped']) expect(hook(dir, ['web', op, 'begin', '-'], xml(UUID)).status).toBe(0);
    expect(fs.existsSync(path.join(dir, UUID, 'intel-rapl:0/energy_uj'))).toBe(true);
    expect(hook(dir, ['web', 'release', 'end', '-'], xml(UUID)).status).toBe(0);
    expect(fs.readdirSync(dir)).toEqual([]);
  });

  it("never fails a domain's start, and removes a planted symlink itself, not what it names", () => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-hook-'));
    dirs.push(root);
    const dir = path.join(root, 'guests');
    const bad = hook(dir, ['web', 'prepare', 'begin', '-'], xml('../../etc'));
    expect(bad.status).toBe(0);
    expect(bad.stderr).toContain('has no UUID');
    expect(fs.existsSync(dir)).toBe(false);
    const victim = path.join(root, 'victim');
    fs.mkdirSync(victim);
    fs.writeFileSync(path.join(victim, 'keep'), 'x');
    fs.mkdirSync(dir);
    fs.symlinkSync(victim, path.join(dir, UUID));
    const r = hook(dir, ['web', 'prepare', 'begin', '-'], xml(UUID));
    expect(r.status).toBe(0);
    expect(r.stderr).toContain('not a directory');
    expect(hook(dir, ['web', 'release', 'end', '-'], xml(UUID)).status).toBe(0);
    expect(fs.readdirSync(dir)).toEqual([]);
    expect(fs.readFileSync(path.join(victim, 'keep'), 'utf8')).toBe('x');
  });
});
