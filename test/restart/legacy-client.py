# A QEMU-like legacy client, in its own process: one connection, requests of 12 bytes (u32 msr, u32 cpu,
# u32 tid, little-endian: docs/protocol.md), each waited for (8-byte reply, u64) as QEMU's vmsr thread
# does; every third request is written in two parts 15 ms apart. Runs until stdin closes, then
# checks that no reply is left over (a reply sent twice would be), and prints one JSON summary.
# Optional arguments: the pause between requests in seconds (default 0.002), and 'whole' to write
# each request in one write, as QEMU does (a crash test: bytes the helper read and did not answer
# die with it).
import json, os, socket, struct, sys, threading, time

path = sys.argv[1]
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.002
whole = len(sys.argv) > 3 and sys.argv[3] == 'whole'
tid = os.getpid()  # a thread of the peer: the helper answers only the peer's own threads
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
sent = answered = 0
max_wait = 0.0
values = []
backwards = 0
def recv_exact(n):
    b = b''
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError('closed by the helper after %d replies' % answered)
        b += c
    return b
print('ready', flush=True)
try:
    while not stop.is_set():
        req = struct.pack('<III', 0x611, 0, tid)
        t0 = time.monotonic()
        if sent % 3 == 2 and not whole:
            s.sendall(req[:5]); time.sleep(0.015); s.sendall(req[5:])
        else:
            s.sendall(req)
        sent += 1
        v = struct.unpack('<Q', recv_exact(8))[0]
        answered += 1
        max_wait = max(max_wait, time.monotonic() - t0)
        if values and v < values[-1]:
            backwards += 1
        values.append(v)
        time.sleep(pause)
    s.setblocking(False)
    time.sleep(0.2)
    try:
        extra = len(s.recv(4096))
    except BlockingIOError:
        extra = 0
    err = None
except Exception as e:
    extra, err = 0, str(e)
print(json.dumps({'sent': sent, 'answered': answered, 'maxWaitMs': max_wait * 1000, 'backwards': backwards,
                  'extraBytes': extra, 'first': values[0] if values else None, 'last': values[-1] if values else None, 'error': err}), flush=True)
