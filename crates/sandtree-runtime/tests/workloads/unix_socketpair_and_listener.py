# unix_socketpair_and_listener: a unix stream socketpair with bytes in flight
# both ways (`inflight` a->b, `back` b->a; b also on a second descriptor), a
# unix datagram socketpair, an unconnected datagram socket bound to an
# abstract name, and a stream listener bound to /root/sock that answers
# `unix-ok` to each connection (unix_socketpair_and_listener.client.py).
# Commands: `state` -> `a2b=<bytes waiting at b> b2a=<at a>`; `drain` ->
# `b_got= a_got=`; `refill` -> sends both ways again, as `state`; `mutate`
# -> drains both, sends `mutated!!` a->b, as `state`; `dgram` -> queues two
# datagrams: `queued`; `dgrams` -> `db_got=<them>`; `passfd` -> sends a
# descriptor along a->b: `queued`; `passfd-drain` -> `got= fds=`; `lone` ->
# a datagram to the lone socket: `queued`; `lone-drain` -> `lone_got=`;
# `ping-pair` -> sends `ping` a->b: `b_got=`.
a, b = socket.socketpair()
a.setblocking(False)
b.setblocking(False)
a.sendall(b'inflight')
b.sendall(b'back')
b_again = os.dup(b.fileno())  # one receiving socket on two descriptors: its bytes once
da, db = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
db.setblocking(False)
lone = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
lone.bind('\0sandtree-lone')
lone.setblocking(False)
sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
lst.bind('/root/sock')
lst.listen(4)

def avail(s):
    return struct.unpack('i', fcntl.ioctl(s.fileno(), termios.FIONREAD, b'\0\0\0\0'))[0]

def drain(s):
    got = b''
    while True:
        try:
            d = s.recv(4096)
        except BlockingIOError:
            break
        if not d:
            break
        got += d
    return got

def on_unix(l):
    c, _ = l.accept()
    try:
        c.sendall(b'unix-ok\n')
    finally:
        c.close()

def handle(cmd):
    if cmd == 'state':
        return 'a2b=%d b2a=%d' % (avail(b), avail(a))
    if cmd == 'drain':
        return 'b_got=%r a_got=%r' % (drain(b), drain(a))
    if cmd == 'refill':
        a.sendall(b'inflight')
        b.sendall(b'back')
        return 'a2b=%d b2a=%d' % (avail(b), avail(a))
    if cmd == 'mutate':
        drain(b)
        drain(a)
        a.sendall(b'mutated!!')
        return 'a2b=%d b2a=%d' % (avail(b), avail(a))
    if cmd == 'dgram':
        da.send(b'datagram')
        da.send(b'second')
        return 'queued'
    if cmd == 'dgrams':
        got = []
        while True:
            try:
                got.append(db.recv(4096))
            except BlockingIOError:
                return 'db_got=%r' % got
    if cmd == 'passfd':
        socket.send_fds(a, [b'fd'], [0])
        return 'queued'
    if cmd == 'passfd-drain':
        msg, fds, _, _ = socket.recv_fds(b, 64, 4)
        for fd in fds:
            os.close(fd)
        return 'got=%r fds=%d' % (msg, len(fds))
    if cmd == 'lone':
        sender.sendto(b'x', '\0sandtree-lone')
        return 'queued'
    if cmd == 'lone-drain':
        return 'lone_got=%r' % drain(lone)
    if cmd == 'ping-pair':
        a.sendall(b'ping')
        time.sleep(0.01)
        return 'b_got=%r' % drain(b)
    raise ValueError(cmd)

serve(handle, extra=[(lst, on_unix)])
