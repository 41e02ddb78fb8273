import { describe, expect, it } from 'vitest';
import net from 'node:net';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync, spawn } from 'node:child_process';
import { capget } from '../../src/os/libc/capability-calls.js';
import { clockTicksPerSecond } from '../../src/os/libc/processes.js';
import { getPeerCredentials, sendUnixDatagram, sockaddrUn, socketFd } from '../../src/os/libc/sockets.js';

function tmpdir(): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-libc-'));
}

describe('libc bindings', () => {
  it('SO_PEERCRED names the connecting process, here a real child', async () => {
    const dir = tmpdir();
    const sock = path.join(dir, 's');
    const server = net.createServer();
    await new Promise<void>((r) => server.listen(sock, r));
    const accepted = new Promise<net.Socket>((r) => server.once('connection', r));
    const child = spawn(process.execPath, ['-e', `require('net').connect(${JSON.stringify(sock)}); setTimeout(()=>{}, 5000)`], {
      stdio: 'ignore',
    });
    try {
      const conn = await accepted;
      const cred = getPeerCredentials(socketFd(conn)!);
      expect(cred.pid).toBe(child.pid);
      expect(cred.uid).toBe(process.getuid!());
      expect(cred.gid).toBe(process.getgid!());
      conn.destroy();
    } finally {
      child.kill();
      server.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('SO_PEERCRED on a non-socket fd fails with the errno named', () => {
    const fd = fs.openSync('/dev/null', 'r');
    try {
      expect(() => getPeerCredentials(fd)).toThrow(/getsockopt\(SO_PEERCRED\): ENOTSOCK/);
    } finally {
      fs.closeSync(fd);
    }
  });

  it('sends a datagram to a path and to an abstract name, received by a real socket', async () => {
    // Node has no AF_UNIX datagram sockets, so the receiver is a python3 child bound before we send.
    const dir = tmpdir();
    const target = path.join(dir, 'notify');
    const abstract = `@vmsr-test-${process.pid}-${Date.now()}`;
    const py = `
import socket,sys
a=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM); a.bind(sys.argv[1])
b=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM); b.bind('\\0'+sys.argv[2][1:])
print('ready',flush=True)
print(a.recv(4096).decode(),flush=True)
print(b.recv(4096).decode(),flush=True)
`;
    const child = spawn('python3', ['-c', py, target, abstract], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    await new Promise<void>((resolve, reject) => {
      const t = setInterval(() => out.includes('ready') && (clearInterval(t), resolve()), 20);
      child.once('exit', () => reject(new Error(`receiver exited: ${out}`)));
    });
    sendUnixDatagram(target, Buffer.from('READY=1\nSTATUS=path'));
    sendUnixDatagram(abstract, Buffer.from('READY=1\nSTATUS=abstract'));
    await new Promise((r) => child.once('exit', r));
    expect(out.split('\n').slice(1, 5).join('|')).toBe('READY=1|STATUS=path|READY=1|STATUS=abstract');
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('a datagram to nobody fails with ENOENT / ECONNREFUSED, not a crash', () => {
    expect(() => sendUnixDatagram('/nonexistent/notify', Buffer.from('x'))).toThrow(/sendto.*ENOENT/);
    expect(() => sendUnixDatagram(`@vmsr-nobody-${process.pid}`, Buffer.from('x'))).toThrow(/sendto.*ECONNREFUSED/);
  });

  it('sockaddr_un: abstract names have no terminator, paths one, too long is refused', () => {
    expect(sockaddrUn('@ab').len).toBe(2 + 1 + 2);
    expect(sockaddrUn('/a').len).toBe(2 + 2 + 1);
    expect(() => sockaddrUn('/' + 'x'.repeat(200))).toThrow(/too long/);
  });

  it('capget reads this thread and agrees with /proc/thread-self/status', () => {
    const caps = capget();
    const status = fs.readFileSync('/proc/thread-self/status', 'utf8');
    const eff = BigInt('0x' + /CapEff:\s*([0-9a-f]+)/.exec(status)![1]);
    const prm = BigInt('0x' + /CapPrm:\s*([0-9a-f]+)/.exec(status)![1]);
    expect(caps.effective).toBe(eff);
    expect(caps.permitted).toBe(prm);
  });

  it('CLK_TCK comes from sysconf', () => {
    const tck = clockTicksPerSecond();
    expect(Number.isInteger(tck) && tck > 0).toBe(true);
    // getconf is the libc's own answer for the same call
    expect(Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim())).toBe(tck);
  });
});
