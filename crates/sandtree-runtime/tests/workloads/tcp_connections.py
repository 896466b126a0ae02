# State: TCP connections with both ends in this process, which a restore
# makes anew in repair mode:
# - `small` (IPv4, through a listener on 7010): the client sent b'request'
#   and the server b'response!', neither read; the client has TCP_NODELAY
#   and SO_KEEPALIVE with TCP_KEEPIDLE 55, the server SO_RCVLOWAT 1;
# - `v6` (IPv6, [::1]:7011): the client sent 3 bytes, not read;
# - `closed`: closed by the server after b'bye' (the client's end in
#   CLOSE_WAIT, unread);
# - `big`: the client wrote as much as the kernel took without blocking
#   (its send queue full, bytes never sent at its end; the server's receive
#   queue full), a pattern of i % 251; nothing read.
# Commands:
# - `state`: for each connection, both ends' ports (own, peer), bytes unread
#   (FIONREAD) and a peek of the small ones, and the options;
# - `mutate`: reads some of what each holds, writes more, closes `v6`,
#   forks a child holding them all that writes 1 GiB of memory;
# - `drain`: reads each connection to its end as the checkpoint had it
#   (`big`: as many bytes as the client had written, checked against the
#   pattern), then a round trip on each, and `closed`'s bytes, its end,
#   and a write the orphaned peer resets:
#   `small=ok v6=ok idle=ok closed=ok big=ok:<n>`;
# - `pending` / `accept`: a client connects to the `small` listener and is
#   not accepted yet (a checkpoint must refuse it) / is accepted, and both
#   ends closed;
# - `halfclose` / `close`: a client connects, is accepted, and shuts its
#   writing down (the server's end is then CLOSE_WAIT: refused) / both
#   closed.

lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(('127.0.0.1', 7010))
lst.listen(8)

c_small = socket.create_connection(('127.0.0.1', 7010))
s_small, _ = lst.accept()
c_small.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
c_small.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
c_small.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 55)
c_small.sendall(b'request')
s_small.sendall(b'response!')

lst6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
lst6.bind(('::1', 7011))
lst6.listen(1)
c_v6 = socket.create_connection(('::1', 7011))
s_v6, _ = lst6.accept()
lst6.close()
c_v6.sendall(b'six')

# `idle`: a keep-alive connection at rest, everything read (the killed
# original's close leaves it in TIME_WAIT).
c_idle = socket.create_connection(('127.0.0.1', 7010))
s_idle, _ = lst.accept()
c_idle.sendall(b'GET')
s_idle.recv(3)
s_idle.sendall(b'200')
c_idle.recv(3)

# `closed`: the server wrote b'bye' and closed (an idle keep-alive
# connection a server timed out): the client's end is CLOSE_WAIT, unread.
c_cw = socket.create_connection(('127.0.0.1', 7010))
s_cw, _ = lst.accept()
s_cw.sendall(b'bye')
s_cw.close()

c_big = socket.create_connection(('127.0.0.1', 7010))
s_big, _ = lst.accept()
c_big.setblocking(False)
PATTERN = bytes(i % 251 for i in range(251 * 1024))
big_sent = 0
while True:
    try:
        chunk = PATTERN[big_sent % 251:big_sent % 251 + 65536]
        n = c_big.send(chunk)
    except BlockingIOError:
        break
    big_sent += n
time.sleep(0.2)

extra = []


def ports(s):
    return '%d>%d' % (s.getsockname()[1], s.getpeername()[1])


def unread(s):
    b = struct.pack('i', 0)
    return struct.unpack('i', fcntl.ioctl(s.fileno(), termios.FIONREAD, b))[0]


def peek(s):
    return s.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT) if unread(s) else b''


def read_exactly(s, n, timeout=10):
    s.setblocking(True)
    s.settimeout(timeout)
    got = b''
    while len(got) < n:
        d = s.recv(min(n - len(got), 1 << 20))
        if not d:
            break
        got += d
    return got


def handle(cmd):
    if cmd == 'state':
        same = c_small.getpeername() == s_small.getsockname() and c_small.getsockname() == s_small.getpeername()
        return ' '.join([
            'small=%s,%s,%d,%d,%s,%s' % (ports(c_small), ports(s_small), unread(c_small), unread(s_small),
                                        peek(c_small).decode(), peek(s_small).decode()),
            'pair=%s' % same,
            'opts=%d,%d,%d,%d' % (c_small.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0,
                                  c_small.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0,
                                  c_small.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                                  s_small.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)),
            'v6=%s,%d,%s' % (ports(c_v6), unread(s_v6), peek(s_v6).decode()),
            'big=%s,%d' % (ports(c_big), big_sent),
            'idle=%s,%d,%d' % (ports(c_idle), unread(c_idle), unread(s_idle)),
            'closed=%s,%d,%s' % (ports(c_cw), unread(c_cw), peek(c_cw).decode()),
        ])
    if cmd == 'mutate':
        # (Whatever is there: after a `drain`, nothing.)
        for s, n in ((s_small, 3), (c_small, 4), (s_v6, 2), (s_big, 100000), (c_cw, 3)):
            s.setblocking(False)
            try:
                s.recv(n)
            except BlockingIOError:
                pass
        c_small.sendall(b'later')
        c_v6.close()
        # A child that holds the connections too, with 1 GiB written: killed
        # by the rollback, it closes them only once its memory is freed,
        # after the restore has made them anew.
        r, w = os.pipe()
        if os.fork() == 0:
            keep = {x.fileno() for x in (c_small, s_small, s_v6, c_idle, s_idle, c_big, s_big, c_cw)} | {w}
            for fd in os.listdir('/proc/self/fd'):
                if int(fd) > 2 and int(fd) not in keep:
                    try:
                        os.close(int(fd))
                    except OSError:
                        pass
            mem = b'\x01' * (1 << 30)
            os.write(w, b'k')
            while True:
                time.sleep(1)
        os.read(r, 1)
        os.close(r)
        os.close(w)
        return 'mutated'
    if cmd == 'drain':
        out = []
        req = read_exactly(s_small, 7, 3)
        resp = read_exactly(c_small, 9, 3)
        c_small.sendall(b'ping')
        s_small.sendall(b'pong')
        ok = req == b'request' and resp == b'response!' and read_exactly(s_small, 4) == b'ping' \
            and read_exactly(c_small, 4) == b'pong'
        out.append('small=%s' % ('ok' if ok else repr((req, resp))))
        six = read_exactly(s_v6, 3, 3)
        c_v6.sendall(b'6')
        ok = six == b'six' and read_exactly(s_v6, 1) == b'6'
        out.append('v6=%s' % ('ok' if ok else repr(six)))
        got = read_exactly(s_big, big_sent)
        want = (PATTERN * (big_sent // len(PATTERN) + 1))[:big_sent]
        c_big.setblocking(True)
        c_big.sendall(b'end')
        ok = got == want and read_exactly(s_big, 3) == b'end'
        c_idle.sendall(b'GET')
        ok_idle = read_exactly(s_idle, 3) == b'GET'
        s_idle.sendall(b'200')
        ok_idle = ok_idle and read_exactly(c_idle, 3) == b'200'
        out.append('idle=%s' % ('ok' if ok_idle else 'bad'))
        bye = read_exactly(c_cw, 4, 3)
        try:
            c_cw.sendall(b'x')
            time.sleep(0.05)
            c_cw.sendall(b'y')
            wrote = 'accepted'
        except (BrokenPipeError, ConnectionResetError):
            wrote = 'reset'
        out.append('closed=%s' % ('ok' if bye == b'bye' and wrote == 'reset' else repr((bye, wrote))))
        out.append('big=%s:%d' % ('ok' if ok else 'bad', len(got)))
        return ' '.join(out)
    if cmd == 'pending':
        extra.append(socket.create_connection(('127.0.0.1', 7010)))
        return 'pending'
    if cmd == 'accept':
        s, _ = lst.accept()
        s.close()
        extra.pop().close()
        return 'accepted'
    if cmd == 'halfclose':
        c = socket.create_connection(('127.0.0.1', 7010))
        s, _ = lst.accept()
        c.shutdown(socket.SHUT_WR)
        extra.extend([c, s])
        return 'halfclosed'
    if cmd == 'close':
        for s in extra:
            s.close()
        extra.clear()
        return 'closed'
    return 'unknown'


serve(handle)
